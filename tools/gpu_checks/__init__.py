"""The prepared GPU run of the whole-step work: two calls of the device machine, each one command.

    bash tools/gpu_checks/run.sh a      # on the GPU machine (the device tool's command), then b
    python -m tools.gpu_checks a --smoke --out out/tools/gpu_checks     # the same list on a CPU
    python -m tools.gpu_checks a --dry-run                              # print the commands

``run.sh`` sets the machine up (``.gpu/setup.sh``: the bundled wheels into /tmp/site, the project
built with its CUDA kernels in /tmp/proj), then runs the call from /tmp/proj. A call is a list of
commands (``tools.gpu_checks.__main__.CALLS``: what each decides, and the calls' time budget), run
by ``tools/run_list.py`` within the call's limit, each under its own ``timeout``, its output kept
as it comes in ``<out>/NN.log``; records and markdown go to ``<out>`` (the device tool's ``$OUT``).
Call ``a``: the CUDA kernels' tests, two ranks on one GPU, the per-module profile, the eager step
and the compiled step in float64; call ``b``: the epoch table, the compiled step in float32 and the
kernel efficiency. ``--smoke`` runs the same lists on the CPU with tiny settings, as the tests do.
"""

from __future__ import annotations
