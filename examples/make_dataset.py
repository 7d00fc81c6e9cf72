"""Write a size-diverse CuNi training set with EMT labels (extended XYZ, the keys mace_run_train
reads).

    python examples/make_dataset.py --out DIR --n-train 200 --n-valid 20 --seed 0 [--max-atoms 500]

writes ``DIR/train.xyz``, ``valid.xyz``, ``test.xyz`` and ``cell512.xyz`` (a 512-atom CuNi cell for
the MD benchmark, see ``examples/md.py``), and prints a summary. Deterministic for a seed. The
structures and labels are :mod:`cfm_plugins.datasets.cuni`'s (``make_dataset`` from Python).
"""

from __future__ import annotations

import argparse
import sys
import time

from cfm_plugins.datasets.cuni import MIN_ATOMS, make_dataset, summary
from cfm_plugins.testing import at_least


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--n-train", type=at_least(1), default=200)
    p.add_argument("--n-valid", type=at_least(1), default=20)
    p.add_argument("--n-test", type=at_least(0), default=None, help="default: same as --n-valid")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-atoms", type=at_least(MIN_ATOMS), default=500)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    print(
        f"making CuNi set in {args.out} (seed {args.seed}, up to {args.max_atoms} atoms)",
        flush=True,
    )
    paths = make_dataset(
        args.out, args.n_train, args.n_valid, args.n_test, args.seed, args.max_atoms, verbose=True
    )
    print(summary(paths))
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
