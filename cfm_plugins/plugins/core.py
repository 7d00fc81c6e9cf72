"""The core's own plugin: the options every run has, and the default rank set-up.

The plugin manager registers this module in every run, under the name ``core``; its
:func:`cfm_init_distributed` runs last, so a plugin may replace it. The
mechanism itself (MPI, the rendezvous, the process group) is :mod:`cfm_plugins.distributed`,
which implements no hook: the hook specifications name its :class:`DistInfo` without an import
circle.
"""

from __future__ import annotations

from cfm_plugins.distributed import DEFAULT_TIMEOUT_S, DistInfo, init_distributed
from cfm_plugins.hookspec import hookimpl
from cfm_plugins.options import Option


@hookimpl
def cfm_declare_options():
    return [
        Option(
            "device",
            str,
            "auto",
            "device of the ranks: auto (cuda when torch sees a GPU), cpu or cuda; "
            "with cuda each rank takes the GPU of its node-local rank",
            ("auto", "cpu", "cuda"),
        ),
        Option(
            "backend",
            str,
            None,
            "torch.distributed backend (default: nccl on cuda, gloo on cpu and where ranks "
            "share a GPU: nccl refuses two ranks on one GPU)",
            ("gloo", "nccl", "mpi"),
        ),
        Option(
            "master_addr",
            str,
            None,
            "address of the rendezvous host (rank 0's; under srun the first node's) (default: "
            "127.0.0.1 on one node, else the address of rendezvous_interface; under srun the "
            "first node of the step; under torchrun torchrun's own)",
        ),
        Option(
            "master_port",
            int,
            None,
            "TCP port of the rendezvous (default: MASTER_PORT, else under mpirun a free port, "
            "under srun the step's reserved port or one derived from the job and step ids, "
            "under torchrun torchrun's own)",
            positive=True,
        ),
        Option(
            "rendezvous_interface",
            str,
            None,
            "network interface (e.g. ib0, eth0) the rendezvous and gloo/nccl use when the ranks "
            "span several nodes (default: the interface of the default route); on one node "
            "everything stays on the loopback interface",
        ),
        Option(
            "collective_timeout",
            float,
            DEFAULT_TIMEOUT_S,
            "seconds a collective waits for a stalled rank "
            "before the run ends with the stalled rank named",
            positive=True,
        ),
        # read by every trainer adapter (each writes what its trainer exposes); declared once here
        Option(
            "step_log",
            str,
            None,
            "write each rank's per-step records (sizes, compute times; losses where the trainer "
            "gives them) to PATH.rank<r>.jsonl; cfm_plugins.steplog reads them and computes the "
            "load imbalance factor",
        ),
    ]


@hookimpl
def cfm_configure(config):
    port = config.get("master_port")
    if port is not None and port > 65535:
        raise ValueError(
            f"cfm-plugins option master_port={config.options.get('master_port')!r}: not a TCP port "
            "(1-65535)"
        )


@hookimpl(trylast=True)
def cfm_init_distributed(config) -> DistInfo:
    return init_distributed(config)
