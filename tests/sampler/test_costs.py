"""Cost models: graph_costs, fit_linear_cost, and calibrate_linear_cost on step timings of a known
cost and noise."""

from __future__ import annotations

import numpy as np
import pytest

from cfm_plugins.sampler import calibrate_linear_cost, fit_linear_cost, graph_costs


def test_graph_costs_kinds():
    a, e = np.array([3, 10]), np.array([12, 80])
    np.testing.assert_array_equal(graph_costs(a), [3.0, 10.0])
    np.testing.assert_array_equal(graph_costs(a, e, kind="edges"), [12.0, 80.0])
    np.testing.assert_allclose(graph_costs(a, e, kind="linear", a=2.0, b=0.5), [12.0, 60.0])
    assert graph_costs(a).dtype == np.float64


def test_a_graph_with_atoms_and_no_edges_costs_one_edge():
    """A single atom (or atoms all beyond the cutoff) is a legal sample: floored at one edge,
    packed; a graph without atoms keeps cost 0, which the packer refuses naming it (issue 24)."""
    atoms, edges = np.array([1, 5, 4, 0]), np.array([0, 20, 0, 0])
    np.testing.assert_array_equal(graph_costs(atoms, edges, kind="edges"), [1.0, 20.0, 1.0, 0.0])
    np.testing.assert_allclose(
        graph_costs(atoms, edges, kind="linear", a=0.0, b=0.5), [0.5, 10.0, 0.5, 0.0]
    )
    np.testing.assert_allclose(
        graph_costs(atoms, edges, kind="linear", a=2.0, b=0.5), [2.0, 20.0, 8.0, 0.0]
    )
    from cfm_plugins.sampler import pack

    costs = graph_costs(atoms[:3], edges[:3], kind="edges")
    assert sorted(pack(costs, 20, 1).indices.tolist()) == [0, 1, 2]
    with pytest.raises(ValueError, match="sample 3 has cost 0.0"):
        pack(graph_costs(atoms, edges, kind="edges"), 20, 1)


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(kind="edges"), "needs num_edges .*use cost=atoms"),
        (dict(kind="linear", b=1.0), "needs num_edges"),
        (dict(kind="nodes"), "expected one of atoms, edges, linear"),
        (dict(num_edges=np.array([1]), kind="edges"), "1 entries but num_atoms has 2"),
        (dict(num_edges=np.array([1, 2]), kind="linear", a=-1.0, b=1.0), "a, b >= 0"),
    ],
)
def test_graph_costs_errors(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        graph_costs(np.array([3, 10]), **kwargs)


class StepClock:
    """The clock of ``calibrate_linear_cost`` in these tests, advanced by a step of known cost:
    ``a*atoms + b*edges`` seconds, each call slowed by up to ``noise`` of it at random (other work
    on a shared machine only ever adds time). The fit then depends on the noise drawn, never on
    this machine's load; real step timings are for the benchmarks."""

    def __init__(self, a: float, b: float, noise: float, seed: int = 0):
        self.a, self.b, self.noise = a, b, noise
        self.rng = np.random.default_rng(seed)
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def step(self, batch):
        atoms, edges = batch
        self.now += (self.a * atoms + self.b * edges) * (1 + self.noise * self.rng.random())


def test_calibrate_linear_cost_recovers_a_known_step_cost_through_noise(monkeypatch):
    """Timings up to 50 % slower than the step's cost (a busy machine), the least of 5 kept per
    batch: the fit finds both coefficients within the noise, and its r2 is at least that of the
    true cost on the same timings (the fit minimises the squared error over every a, b >= 0)."""
    from cfm_plugins.sampler import costs

    a_true, b_true, noise = 2e-6, 5e-7, 0.5
    clock = StepClock(a_true, b_true, noise)
    monkeypatch.setattr(costs, "time", clock)
    # atoms and edges varied independently, so both coefficients are identifiable
    sizes = [(a, e) for a in (1000, 3000, 6000) for e in (5000, 20000, 40000)]
    atoms = [a for a, _ in sizes]
    edges = [e for _, e in sizes]
    fit = calibrate_linear_cost(clock.step, sizes, atoms, edges, repeats=5)
    a, b = fit  # unpacks as (a, b)
    assert a == pytest.approx(a_true, rel=noise) and b == pytest.approx(b_true, rel=noise), fit
    assert len(fit.times) == len(sizes) and np.all(fit.times > 0)
    true = a_true * np.array(atoms) + b_true * np.array(edges)
    assert np.all(fit.times >= true) and np.all(fit.times <= true * (1 + noise))
    ss_true = np.sum((fit.times - true) ** 2)
    r2_true = 1 - ss_true / np.sum((fit.times - fit.times.mean()) ** 2)
    assert fit.r2 >= r2_true - 1e-12 and fit.r2 > 0.6, (fit, r2_true)
    na, nb = calibrate_linear_cost(clock.step, sizes, atoms, edges, repeats=1, normalize=True)
    assert na == 1.0 and nb > 0
    costs_ = graph_costs(np.array(atoms), np.array(edges), kind="linear", a=a, b=b)
    assert np.all(costs_ > 0)


def test_calibrate_errors():
    with pytest.raises(ValueError, match=">= 2 batches"):
        calibrate_linear_cost(lambda b: None, [1], [1], [1])


def test_fit_linear_cost_recovers_coefficients_and_intercept():
    rng = np.random.default_rng(1)
    atoms = rng.integers(20, 600, 50)
    edges = atoms * 12 + rng.integers(-500, 500, 50)
    t = 3e-3 + 2e-5 * atoms + 1.5e-6 * edges
    fit = fit_linear_cost(atoms, edges, t, intercept=True)
    assert fit.c0 == pytest.approx(3e-3, rel=1e-8)
    assert fit.a == pytest.approx(2e-5, rel=1e-8) and fit.b == pytest.approx(1.5e-6, rel=1e-8)
    assert fit.r2 == pytest.approx(1.0) and "c0=" in repr(fit)
    no_c0 = fit_linear_cost(atoms, edges, t - 3e-3)
    assert no_c0.c0 == 0.0 and tuple(no_c0) == pytest.approx((2e-5, 1.5e-6), rel=1e-8)


def test_fit_linear_cost_never_gives_a_negative_weight():
    """Nearly collinear counts where the unconstrained fit puts a negative weight on atoms."""
    rng = np.random.default_rng(2)
    atoms = rng.integers(50, 500, 60).astype(float)
    edges = atoms * 15 + rng.integers(-800, 800, 60)
    t = 4e-6 * edges - 1e-6 * atoms + 1e-3
    free, *_ = np.linalg.lstsq(np.stack([atoms, edges, np.ones_like(t)], 1), t, rcond=None)
    assert free[0] < 0
    fit = fit_linear_cost(atoms, edges, t, intercept=True)
    assert fit.a == 0.0 and fit.b > 0 and fit.c0 >= 0
    # and it is the best fit without atoms
    x = np.stack([edges, np.ones_like(t)], 1)
    best = np.sum((x @ np.linalg.lstsq(x, t, rcond=None)[0] - t) ** 2)
    assert np.sum((fit.predicted - t) ** 2) == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize(
    "args, msg",
    [
        (([1, 2], [3, 4], [1.0]), "of one length"),
        (([1], [3], [1.0]), "at least 2"),
        (([1, 2], [3, 4], [1.0, float("nan")]), "NaN"),
    ],
)
def test_fit_linear_cost_errors(args, msg):
    with pytest.raises(ValueError, match=msg):
        fit_linear_cost(*args)
