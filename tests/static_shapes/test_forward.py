"""StaticForward on a toy model: outputs cut to the real batch, install/remove, copies, compile
modes."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from cfm_plugins.static_shapes import forward
from cfm_plugins.static_shapes.forward import REAL_SIZES, check_compile_mode, cut


class Toy(torch.nn.Module):
    """Per-atom values, summed per graph (``batch``), and a per-edge output."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, data, training=False):
        x = data["x"] * self.w
        energy = torch.zeros(data["ptr"].numel() - 1).index_add(0, data["batch"], x)
        return {"energy": energy, "node": x, "edge": data["edge"] * self.w, "unknown": x.sum()}


SPEC = forward.ModelSpec({"energy": "graph", "node": "atom", "edge": "edge"}, grad_inputs=())


def padded_toy():
    """2 real graphs (3 + 2 atoms, 4 edges), padded to 4 graphs, 8 atoms, 6 edges."""
    data = {
        "x": torch.arange(8.0),
        "batch": torch.tensor([0, 0, 0, 1, 1, 2, 2, 2]),
        "ptr": torch.tensor([0, 3, 5, 8, 8]),
        "edge": torch.ones(6),
    }
    return data, (2, 5, 4, 4, 8, 6)


def test_outputs_are_cut_to_the_real_graphs_atoms_and_edges():
    model = Toy()
    forward.install(model, SPEC)
    data, real = padded_toy()
    out = model(dict(data, **{REAL_SIZES: real}))
    assert out["energy"].tolist() == [2 * (0 + 1 + 2), 2 * (3 + 4)]
    assert out["node"].shape == (5,) and out["edge"].shape == (4,)
    assert out["unknown"].dim() == 0  # scalars pass
    plain = model(dict(data))  # no REAL_SIZES: nothing is cut
    assert plain["energy"].shape == (4,)


def test_an_output_without_a_level_is_placed_by_its_size_or_refused():
    data, real = padded_toy()
    out = cut({"per_graph": torch.zeros(4), "per_edge": torch.zeros(6, 3)}, real, {})
    assert out["per_graph"].shape == (2,) and out["per_edge"].shape == (4, 3)
    with pytest.raises(ValueError, match="cannot be placed"):
        cut({"odd": torch.zeros(7)}, real, {})
    with pytest.raises(ValueError, match="Hessian"):
        cut({"hessian": torch.zeros(24, 24)}, real, {"hessian": "whole"})


def test_remove_gives_the_class_forward_back_and_copies_get_their_own():
    model = Toy()
    fwd = forward.install(model, SPEC)
    assert forward.install(model, SPEC) is fwd and forward.installed(model) is fwd
    twin = copy.deepcopy(model)
    assert forward.installed(twin) is not None and forward.installed(twin) is not fwd
    data, real = padded_toy()
    with torch.no_grad():
        twin.w.fill_(3.0)
    assert twin(dict(data, **{REAL_SIZES: real}))["energy"].tolist() == [
        9.0,
        21.0,
    ]  # the copy's own weight
    assert model(dict(data, **{REAL_SIZES: real}))["energy"].tolist() == [6.0, 14.0]
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(model)
    assert forward.remove(model) and not forward.remove(model)
    assert "forward" not in model.__dict__
    pickle.loads(pickle.dumps(model))  # a stock module again


def test_compile_modes_are_checked_against_the_device():
    assert check_compile_mode("default", "cpu") == "default"
    with pytest.raises(ValueError, match="CUDA device"):
        check_compile_mode("reduce-overhead", "cpu")
    with pytest.raises(ValueError, match="expected one of"):
        check_compile_mode("fast", "cpu")


def test_compiled_toy_forward_is_exact_and_compiles_once_per_shape():
    torch._dynamo.reset()
    model = Toy()
    fwd = forward.install(model, SPEC, compile="default")
    before = (
        forward.compile_counts()
    )  # dynamo's counters are per process: earlier tests' breaks stay in them
    data, real = padded_toy()
    for _ in range(3):  # same padded shape, different real sizes: one graph
        out = model(dict(data, **{REAL_SIZES: real}))
        out2 = model(dict(data, **{REAL_SIZES: (1, 3, 2, 4, 8, 6)}))
    assert out["energy"].tolist() == [6.0, 14.0] and out2["energy"].tolist() == [6.0]
    after = forward.compile_counts()
    assert after["graphs"] - before["graphs"] == 1 and len(fwd.shapes) == 1
    assert after["graph_breaks"] == before["graph_breaks"]  # no graph break of its own


class Forces(torch.nn.Module):
    """An energy of positions through three 1.4 MB layers, and its forces taken inside the
    forward (as MACE's ``compute_forces``): more parameters than one 1 MB DDP bucket holds."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (
            torch.nn.Linear(3, 600),
            torch.nn.Linear(600, 600),
            torch.nn.Linear(600, 1),
        )

    def forward(self, pos):
        energy = self.c(torch.tanh(self.b(torch.tanh(self.a(pos))))).sum()
        (grad,) = torch.autograd.grad(energy, pos, create_graph=self.training)
        return energy, -1 * grad


def test_compiled_forces_under_ddp_with_several_buckets_match_eager():
    """Dynamo's DDP optimizer splits a graph at bucket boundaries, and autograd.grad cannot cross
    the split (``-1 * None``); compiling turns it off, so the forces and parameter gradients are
    eager's."""
    import torch.distributed as dist

    torch._dynamo.reset()
    torch.manual_seed(0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        eager, compiled = Forces(), Forces()
        compiled.load_state_dict(eager.state_dict())
        compiled.forward = forward.compile_forward(compiled.forward, backend="aot_eager")
        ddp = torch.nn.parallel.DistributedDataParallel(compiled, bucket_cap_mb=1)
        pos = torch.randn(7, 3)
        results = []
        for module, owner in (
            (ddp, compiled),
            (eager, eager),
        ):  # owner: the module holding the parameters
            energy, forces = module(pos.clone().requires_grad_(True))
            (energy + forces.square().sum()).backward()
            results.append((energy, forces, [p.grad for p in owner.parameters()]))
        (e1, f1, g1), (e2, f2, g2) = results
        torch.testing.assert_close(e1, e2)
        torch.testing.assert_close(f1, f2)
        for a, b in zip(g1, g2, strict=True):
            torch.testing.assert_close(a, b)
    finally:
        dist.destroy_process_group()
