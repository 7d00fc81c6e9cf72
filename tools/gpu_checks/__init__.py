"""The prepared GPU run of the whole-step work: two calls of the device machine, each one command.

    bash tools/gpu_checks/run.sh a      # on the GPU machine (the device tool's command), then b
    python -m tools.gpu_checks a --smoke --out out/tools/gpu_checks     # the same list on a CPU
    python -m tools.gpu_checks a --dry-run                              # print the commands

Each call is a list of commands (:data:`CALLS`) run by ``tools/run_list.py`` within the call's
limit, each command under its own ``timeout`` too (a slow one cannot eat the next ones' minutes),
its output kept as it comes in ``<out>/NN.log``; records and markdown go to ``<out>`` (the device
tool's ``$OUT``). The commands are in the order of what they decide, the cheapest decisive first:

call ``a`` (about 5 minutes on an H100 after the set-up):

0. the C++ CUDA kernels' outputs stored whole without a zero fill (the conv TP tests on CUDA: the
   change was compiled here, never run);
1. the two ranks sharing one GPU with gloo (the test ``tests/test_distributed.py -k on_one_gpu``:
   the same losses and weights as on the CPU to 1e-8, float64);
2. the per-module profile of the train step at 4000 atoms, float64 and float32, cuEquivariance
   and ours in one run, ours with the default kernels and with the skip connection's kernel
   named (its GPU kernel runs only then; ``tools.gpu_profile --by-module --kernels-also``);
3. the eager train step at 500, 2000 and 4000 atoms, float32 and float64, stock, cuEquivariance
   and ours (default kernels, with the skip connection's kernel, and with the radial fusion too)
   in one run (``benchmarks.gpu_mace``: the record ``gpu_mace_step``);
4. the compiled static step (``compile=default``, no capture) at 4000 atoms in float64: exact
   against the eager step (1e-10), its compile time, its step time (``tools.gpu_capture --mode
   default``);

call ``b`` (about 8 minutes):

5. the fair epoch table: ``mace_run_train`` on 300 structures, float32, the second epoch timed:
   stock; stock + binpack; cuEquivariance; cuEquivariance + binpack; the fused kernels alone;
   fused + binpack; and fused + binpack + static with ``compile=default`` over 5 epochs, with the
   epoch after which its compile is repaid (``benchmarks.gpu_mace --no-steps``: the record
   ``gpu_mace_epoch``);
6. the compiled static step in float32 at 500 and 4000 atoms, with the skip connection's
   kernel.

Budget: call ``a`` is the set-up (one to two minutes on a fresh machine, seconds on a warm one)
and a list limited to 420 s, call ``b`` a list limited to 540 s: each fits one device command of
at most 600 s (``timeout_s=600``, ``.gpu`` carried), and both together fit 15 minutes of device
time with the machine's start. A command cut by its own limit keeps what it printed; the lists'
limits bind (their commands' own limits add up to more), so what is not reached is said
("not started: no time left") and goes first into the next call.

``run.sh`` first sets the machine up (``.gpu/setup.sh``: the bundled wheels into /tmp/site, the
project built with its CUDA kernels in /tmp/proj; see CONTRIBUTING.md, "On a GPU machine without a
package registry"), then runs the call from /tmp/proj. ``--smoke`` runs the same lists on the CPU
with tiny settings (``--quick``, fewer epoch ways and epochs), as the tests do.
"""

from __future__ import annotations
