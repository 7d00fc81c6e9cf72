"""Kernel benchmarks: fused vs stock, ratios measured in the same run.

    python -m benchmarks.kernels                      # both kernels, full workloads
    python -m benchmarks.kernels symmetric_contraction --quick
    python -m benchmarks.kernels conv_tp --quick

Each kernel's benchmark lives in ``kernels_<kernel>.py`` (``main(argv)``) and prints its workload,
its command and a markdown table (also written to ``docs/_fragments/kernels_<kernel>.md``).
"""

from __future__ import annotations

import importlib
import sys

KERNELS = ("symmetric_contraction", "conv_tp")


def gpu_note(cuda_source: str, alone: str) -> str:
    """The note under a CPU kernel table (its fragment) on where the same operator's GPU kernels
    are timed: ``cuda_source`` is its C++ CUDA file, ``alone`` what ``gpu_kernels.py`` times."""
    return f"""\
GPU: this script times the CPU kernels. The same operator's GPU kernels (Triton, the default on
GPUs, and C++ CUDA, `{cuda_source}`, with `fused_backend=cuda`) are timed on a GPU by
`benchmarks/gpu_kernels.py` ({alone}, against stock and cuEquivariance) and
`benchmarks/gpu_mace.py` (the MACE step): docs/benchmarks.md's GPU sections and docs/gpu.md."""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = [a for a in argv if a in KERNELS] or list(KERNELS)
    rest = [a for a in argv if a not in KERNELS]
    for kernel in chosen:
        print(f"\n===== {kernel} =====", flush=True)
        importlib.import_module(f"benchmarks.kernels_{kernel}").main(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
