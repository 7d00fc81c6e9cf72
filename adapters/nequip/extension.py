"""NequIP's extension entry point (``nequip.extension``: ``init_always``): registers
``enable_CFMFused``.

``import nequip`` imports every ``init_always`` entry of that group *while nequip itself is still
being imported*, so nothing of ``nequip.nn`` may be imported here (it would import a half-built
nequip). Instead a one-shot import hook waits for ``nequip.nn._tp_scatter_base`` and adds the
modifier to its ``TensorProductScatter`` right after that module has run, and loads the library
of our ``cfm::`` operators (what a package compiled with the modifier calls). Nothing else in
nequip is changed, and nothing happens unless nequip is used.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

TARGET = "nequip.nn._tp_scatter_base"


def _register(module) -> None:
    from cfm_plugins.api import declare_operators
    from cfm_plugins_adapters.nequip.modifier import register

    register(module.TensorProductScatter)
    # declare the cfm:: operators, so that a model compiled with `nequip-compile --modifiers
    # enable_CFMFused` loads (NequIPCalculator.from_compiled_model) without importing cfm_plugins
    declare_operators()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of :data:`TARGET` to register after it ran."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module, _run=run):
            _run(module)
            _register(module)

        spec.loader.exec_module = exec_module  # this loader instance belongs to this spec only
        return spec


def install() -> None:
    module = sys.modules.get(TARGET)
    if module is not None and hasattr(module, "TensorProductScatter"):
        _register(module)
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


install()
