"""Short molecular dynamics with ``CFMCalculator`` (fused kernels) on a CuNi cell, timed per step.

    python examples/md.py --model MODEL.model [--atoms out/cell512.xyz] [--steps 20] [--compare]

``--atoms`` defaults to a fresh 512-atom CuNi cell (``cfm_plugins.datasets.cuni.make_cell512``).
``--compare`` also runs mace's own ``MACECalculator`` on the same start and prints the ratio of
the times per step (measured in the same run, one after the other). The timing is
``cfm_plugins.calculators.time_md(calc, atoms, steps)``, which works with any ASE calculator.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cfm_plugins.calculators.md import time_md
from cfm_plugins.testing import at_least


def _load_atoms(path):
    if path:
        from ase.io import read

        if not Path(path).is_file():
            raise FileNotFoundError(
                f"no structure file at {path!r} (--atoms: a file ASE reads, e.g. .xyz, "
                "POSCAR, .cif; leave it out for a new 512-atom CuNi cell)"
            )
        return read(path)  # the last frame of a trajectory
    from cfm_plugins.datasets.cuni import make_cell512

    return make_cell512(0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="MACE .model file (whole pickled model)")
    p.add_argument(
        "--atoms", default=None, help="structure file (default: a new 512-atom CuNi cell)"
    )
    p.add_argument("--steps", type=at_least(1), default=20)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    p.add_argument(
        "--kernels",
        default="symmetric_contraction,conv_tp",
        help="comma list of fused kernels (empty: none)",
    )
    p.add_argument(
        "--repeats", type=at_least(1), default=2, help="timed runs per calculator (best is kept)"
    )
    p.add_argument(
        "--compare", action="store_true", help="also time mace's MACECalculator; print the ratio"
    )
    args = p.parse_args(argv)

    from cfm_plugins.calculators import CFMCalculator
    from cfm_plugins.calculators.atoms_checks import check_atoms

    kernels = tuple(k for k in args.kernels.split(",") if k)
    try:
        atoms = _load_atoms(args.atoms)
        calc = CFMCalculator(
            args.model, device=args.device, default_dtype=args.dtype, kernels=kernels
        )
        check_atoms(
            atoms, calc.z_table.zs, f"--atoms {args.atoms}" if args.atoms else "the CuNi cell"
        )
    except (
        OSError,
        ValueError,
        TypeError,
        RuntimeError,
    ) as err:  # the calculator's errors say what to do
        p.error(str(err))
    print(f"{len(atoms)} atoms, {args.steps} VelocityVerlet steps of 2 fs, {calc}")
    print(f"  swapped: {'; '.join(str(r) for r in calc.patch_reports)}")
    calcs = {"CFMCalculator": calc}
    if args.compare:
        from mace.calculators import MACECalculator

        calcs["MACECalculator"] = MACECalculator(
            model_paths=args.model, device=args.device, default_dtype=args.dtype
        )
    # alternate the calculators, keep each one's best: the machine may be shared and noisy
    best = {name: float("inf") for name in calcs}
    for rep in range(args.repeats):
        for name, c in calcs.items():
            t = time_md(c, atoms, args.steps)
            best[name] = min(best[name], t)
            print(f"  run {rep + 1}: {name:15s} {t * 1e3:9.1f} ms/step", flush=True)
    for name, t in best.items():
        print(f"{name + ':':16s} {t * 1e3:9.1f} ms/step (best of {args.repeats})")
    if args.compare:
        ratio = best["MACECalculator"] / best["CFMCalculator"]
        print(f"speed-up (MACECalculator time / CFMCalculator time): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
