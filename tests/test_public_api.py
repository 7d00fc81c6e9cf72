"""The public names of the package root: ``import cfm_plugins`` stays cheap (no torch), and
``cfm_plugins.library_paths()`` / ``cfm_plugins.load_library()`` name and load the compiled
``cfm::`` operator libraries (what docs/export.md tells users to call)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import cfm_plugins
from cfm_plugins.ops import _library

built = pytest.mark.skipif(
    _library.library_file("cpu") is None, reason="the compiled cfm:: operator library is not built"
)


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter (no cfm-run, MPI or CFM_ settings) and return its
    stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "CFM_"))}
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_import_is_cheap():
    out = run_python(
        "import sys, cfm_plugins; print(sorted(m for m in ('torch', 'numpy', 'cfm_plugins.ops') "
        "if m in sys.modules))"
    )
    assert out.split("\n")[-2] == "[]"
    assert {"library_paths", "load_library"} <= set(cfm_plugins.__all__)


@built
def test_library_paths_names_the_built_libraries():
    paths = cfm_plugins.library_paths()
    assert paths == _library.library_paths() and len(paths) == 1
    assert Path(paths[0]).is_file()


@built
def test_load_library_declares_the_operators_in_a_fresh_process():
    out = run_python(
        "import sys, torch, cfm_plugins\npaths = cfm_plugins.load_library()\nprint(paths == "
        "cfm_plugins.library_paths(cuda=torch.cuda.is_available() and len(paths) == "
        "2))\nprint(all(hasattr(torch.ops.cfm, op) for op in ('symmetric_contraction_fwd', "
        "'conv_tp_fwd')))\nprint('cfm_plugins.ops.patching' in sys.modules)\n"
    )
    assert out.split() == ["True", "True", "False"]  # loaded without the fused modules or patching


def test_missing_library_is_an_error_with_the_build_hint(monkeypatch):
    monkeypatch.setattr(_library, "library_file", lambda kind: None)
    monkeypatch.setattr(_library, "_LOADED", {})
    monkeypatch.setattr(_library, "_WHY", {})
    for call in (cfm_plugins.library_paths, lambda: cfm_plugins.load_library(cuda=False)):
        with pytest.raises(
            RuntimeError, match="not built: build them with `pip install --no-build-isolation"
        ):
            call()


def test_the_adapter_api_is_cheap_and_names_the_owners_objects(monkeypatch):
    """``cfm_plugins.api``: importing it imports no torch; each declared name is the object of the
    module that owns it, looked up at each import (a replacement in that module is seen); an
    undeclared name is an AttributeError."""
    import importlib

    from cfm_plugins import api

    out = run_python("import sys, cfm_plugins.api; print('torch' in sys.modules)")
    assert out.split() == ["False"]
    assert len(api.__all__) == len(set(api.__all__)) > 30
    for name in api.__all__:
        module, attr = api._SOURCES[name]
        owner = importlib.import_module(module)
        assert getattr(api, name) is (owner if attr is None else getattr(owner, attr)), name
    from cfm_plugins import step_timer

    monkeypatch.setattr(step_timer, "hand_over", "replaced")
    assert api.hand_over == "replaced"
    with pytest.raises(AttributeError, match="has no attribute 'Packing'"):
        api.Packing  # noqa: B018


def test_the_adapters_import_the_core_only_through_the_api():
    """What import-linter's contract checks in ``make lint``, here for ``make test``: no module of
    adapters/ imports a module of ``cfm_plugins`` other than ``cfm_plugins.api`` (the package's
    top-level names are public too)."""
    import ast

    found = []
    files = sorted((Path(__file__).resolve().parents[1] / "adapters").rglob("*.py"))
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            found += [
                f"{path.name}:{node.lineno} {n}"
                for n in names
                if n.startswith("cfm_plugins.") and n != "cfm_plugins.api"
            ]
    assert len(files) > 20 and not found, found
