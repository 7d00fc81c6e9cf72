"""HydraGNN from source (its MACE stack): where it is, why its tests skip, and small MACE-stack
models.

HydraGNN 3.0 (PyPI) lives in ``.venv``; HydraGNN's source, the only one with ``MACEStack``, in
``.venv-hydragnn`` (``make venv-hydragnn-src``, made from ``../shared/deps``). The two cannot share
the name ``hydragnn``, so the tests of each skip in the other's environment, saying which.
:func:`skip_unless_source` is checked without importing HydraGNN; the model helpers import it.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.helpers import ROOT, load_example

#: where the Makefile looks for the source tarball and the torch-scatter wheel (HYDRAGNN_DEPS
# overrides)
DEPS = Path(os.environ.get("HYDRAGNN_DEPS", ROOT.parent / "shared" / "deps"))
EXAMPLE = ROOT / "examples" / "hydragnn" / "mace"


def is_source() -> bool:
    """Whether the importable ``hydragnn`` is a source tree with the MACE stack (not 3.0)."""
    spec = importlib.util.find_spec("hydragnn")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(
        (Path(p) / "models" / "MACEStack.py").is_file() for p in spec.submodule_search_locations
    )


def skip_unless_source() -> None:
    """Skip the calling test module, saying why, unless HydraGNN from source is importable."""
    if is_source():
        return
    if not list(DEPS.glob("HydraGNN-*.tar.gz")):
        pytest.skip(
            f"HydraGNN from source (MACEStack) is needed and {DEPS} has no HydraGNN-*.tar.gz to "
            "make .venv-hydragnn from (set HYDRAGNN_DEPS to the folder that has it)",
            allow_module_level=True,
        )
    pytest.skip(
        "HydraGNN from source (MACEStack) is not in this environment: `make test-hydragnn-src` "
        "runs these tests in .venv-hydragnn",
        allow_module_level=True,
    )


def skip_if_source() -> None:
    """Skip the calling HydraGNN 3.0 test module in the HydraGNN-from-source environment."""
    if is_source():
        pytest.skip(
            "a HydraGNN 3.0 test (its API: hydragnn.utils.setup_ddp, ...); this environment has "
            "HydraGNN from source: `make test-all` runs it in .venv",
            allow_module_level=True,
        )


def example_config(**architecture) -> dict:
    """The example's HydraGNN config (examples/hydragnn/mace/config.json), Architecture entries
    replaced."""
    config = json.loads((EXAMPLE / "config.json").read_text())
    config["NeuralNetwork"]["Architecture"].update(architecture)
    return config


def single_process_group():
    """A one-rank gloo group: HydraGNN's ``update_config`` gathers graph statistics over ranks."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return True
    return False


def build_model(graphs, **architecture):
    """HydraGNN's MACE stack (``create_model_config``, as its scripts build it) for ``graphs``, with
    the example's config and ``architecture`` entries replaced; returns (model, full config).
    Needs a process group (:func:`single_process_group`)."""
    import hydragnn
    import hydragnn.utils.input_config_parsing  # noqa: F401  (not imported by `import hydragnn`)
    from torch_geometric.loader import DataLoader

    config = example_config(**architecture)
    loaders = [DataLoader(graphs, batch_size=4) for _ in range(3)]
    config = hydragnn.utils.input_config_parsing.update_config(config, *loaders)
    model = hydragnn.models.create_model_config(config=config["NeuralNetwork"], verbosity=0)
    return model.eval(), config


def energy_forces(model, batch, create_graph=False):
    """Energies and forces of a batch: ``examples/hydragnn/mace/evaluate.py``'s
    ``energy_forces``."""
    return load_example("hydragnn/mace/evaluate.py").energy_forces(model, batch, create_graph)
