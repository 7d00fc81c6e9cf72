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
