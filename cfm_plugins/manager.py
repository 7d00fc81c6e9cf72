"""The plugin manager: finds plugins through entry points and enables the ones asked for.

Plugins are registered under the entry-point group ``cfm_plugins`` (``name = "module"`` or
``"module:object"``). Only the plugins the user enables are imported and registered; the core's
own implementations (MPI rendezvous) are always registered, last, so a plugin can override them.
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from importlib.metadata import entry_points

import pluggy

from cfm_plugins import hookspec
from cfm_plugins.config import Config

log = logging.getLogger("cfm_plugins")

GROUP = "cfm_plugins"


class UnknownPluginError(ValueError):
    """A plugin name that no installed entry point provides."""


@dataclass(frozen=True)
class PluginInfo:
    name: str
    value: str  # "module" or "module:object"
    distribution: str
    summary: str


def available_plugins() -> dict[str, PluginInfo]:
    """Every installed plugin of the ``cfm_plugins`` group, by name (nothing imported)."""
    found: dict[str, PluginInfo] = {}
    for ep in entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        dist_name = f"{dist.name} {dist.version}" if dist is not None else "?"
        found[ep.name] = PluginInfo(ep.name, ep.value, dist_name, _summary(ep.value))
    return dict(sorted(found.items()))


def _summary(value: str) -> str:
    """First docstring line of the plugin module, read without importing it."""
    import ast
    import importlib.util

    modname = value.split(":", 1)[0]
    try:
        spec = importlib.util.find_spec(modname)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return ""
        with open(spec.origin) as fh:
            doc = ast.get_docstring(ast.parse(fh.read())) or ""
    except (ImportError, OSError, SyntaxError, ValueError):
        return ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def load_plugin(info: PluginInfo):
    module_name, _, attr = info.value.partition(":")
    obj = importlib.import_module(module_name)
    return getattr(obj, attr) if attr else obj


def create_manager(config: Config) -> pluggy.PluginManager:
    """A plugin manager with the enabled plugins of ``config`` registered.

    Raises :class:`UnknownPluginError` naming the unknown plugin and listing the known ones.
    """
    pm = pluggy.PluginManager(hookspec.PROJECT)
    pm.add_hookspecs(hookspec)
    from cfm_plugins import distributed  # the core's default implementations

    pm.register(distributed, name="core.distributed")
    known = available_plugins()
    unknown = [n for n in config.enabled if n not in known]
    if unknown:
        raise UnknownPluginError(
            f"unknown cfm-plugins plugin(s): {', '.join(unknown)} (enabled from {config.source}). "
            f"Installed plugins: {', '.join(known) or 'none'}. See `cfm-run --list`."
        )
    for name in config.enabled:
        pm.register(load_plugin(known[name]), name=name)
        log.debug("enabled plugin %s (%s)", name, known[name].value)
    pm.hook.cfm_configure(config=config)
    return pm


@dataclass
class Session:
    """What an adapter's seams need while a trainer runs: the hooks, the options, the ranks."""

    pm: pluggy.PluginManager
    config: Config
    dist: object  # cfm_plugins.distributed.DistInfo

    @property
    def hook(self):
        return self.pm.hook


_ACTIVE: Session | None = None


def set_active(session: Session | None) -> None:
    """Make ``session`` the process-wide one that adapters' seams consult."""
    global _ACTIVE
    _ACTIVE = session


def get_active() -> Session | None:
    return _ACTIVE
