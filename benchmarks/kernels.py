"""Kernel benchmarks on the CPU: the fused kernels against stock (and cuEquivariance's), ratios
measured in the same run.

    python -m benchmarks.kernels                      # every kernel, full workloads
    python -m benchmarks.kernels symmetric_contraction --quick
    python -m benchmarks.kernels conv_tp --quick
    python -m benchmarks.kernels skip_tp --quick

Each kernel's benchmark lives in ``kernels_<kernel>.py`` (``main(argv)``; see its own ``--help``
for the workload and the options, which this command passes on) and prints its workload, its
command and a table, which it also writes as its record (``kernels_<kernel>``, in ``--out``,
default ``out/benchmarks/``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

KERNELS = ("symmetric_contraction", "conv_tp", "skip_tp")


def gpu_note(cuda_source: str, alone: str) -> str:
    """The note under a CPU kernel table (its record) on where the same operator's GPU kernels
    are timed: ``cuda_source`` is its C++ CUDA file, ``alone`` what ``gpu_kernels.py`` times."""
    return (
        "GPU: this benchmark times the CPU kernels. The same operator's GPU kernels (Triton, the "
        f"default on GPUs, and C++ CUDA, {cuda_source}, with fused_backend=cuda) are timed on a "
        f"GPU by python -m benchmarks.gpu_kernels ({alone}, against stock and cuEquivariance) and "
        "python -m benchmarks.gpu_mace (the MACE step)."
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Other options go to each kernel's benchmark: python -m "
        "benchmarks.kernels_conv_tp --help, python -m benchmarks.kernels_symmetric_contraction "
        "--help, python -m benchmarks.kernels_skip_tp --help (--quick and --out are common to "
        "all).",
    )
    p.add_argument(
        "kernels",
        nargs="*",
        metavar="KERNEL",
        help=f"the kernels to time: {', '.join(KERNELS)} (default: all)",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        p.parse_args(["--help"])  # prints the help and exits
    # the kernels are named by word anywhere in the line; the rest goes to their benchmarks
    chosen = [a for a in argv if a in KERNELS]
    rest = [a for a in argv if a not in KERNELS]
    for kernel in chosen or KERNELS:
        print(f"\n===== {kernel} =====", flush=True)
        importlib.import_module(f"benchmarks.kernels_{kernel}").main(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
