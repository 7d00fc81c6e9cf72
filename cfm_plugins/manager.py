"""The plugin manager: finds plugins through entry points and enables the ones asked for.

Plugins are registered under the entry-point group ``cfm_plugins`` (``name = "module"`` or
``"module:object"``). At start every installed plugin is asked what options it declares
(:func:`cfm_plugins.hookspec.cfm_declare_options`) and, if it is a trainer adapter, whether it
serves the trainer command (:func:`cfm_plugins.hookspec.cfm_adapter_serves`); only the enabled
plugins (and the adapter serving the command) are registered in the manager that runs the hooks.
The core's own implementations (MPI rendezvous, core options) are always registered, last, so a
plugin can override them. The manager lives on the configuration (``config.pm``).
"""

from __future__ import annotations

import importlib
import logging
import shlex
from dataclasses import dataclass, field
from importlib.metadata import entry_points

import pluggy

from cfm_plugins import hookspec
from cfm_plugins.config import Config
from cfm_plugins.options import DeclaredOption, TrainerSettings, collect

log = logging.getLogger("cfm_plugins")

GROUP = "cfm_plugins"
CORE = "core"  # the name the core's own hook implementations are registered under


class UnknownPluginError(ValueError):
    """A plugin name that no installed entry point provides."""


class MissingAdapterError(ValueError):
    """Features that act through a trainer adapter were enabled, and no adapter serves the
    command."""


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


def _new_pm() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspec.PROJECT)
    pm.add_hookspecs(hookspec)
    from cfm_plugins.plugins import core  # the core's default implementations and options

    pm.register(core, name=CORE)
    return pm


@dataclass
class Catalog:
    """Every installed plugin, loaded, with what it declares (for checks and ``--list``)."""

    pm: pluggy.PluginManager  # all installed plugins registered: only declarations are called on it
    plugins: dict[str, PluginInfo]
    broken: dict[str, str]  # plugin name -> why it could not be loaded

    def _impls(self, name):
        return getattr(self.pm.hook, name).get_hookimpls()

    def declarations(self) -> list[tuple[str, list]]:
        return [(impl.plugin_name, impl.function()) for impl in self._impls("cfm_declare_options")]

    def options(self) -> dict[str, DeclaredOption]:
        return collect(self.declarations())

    def owners(self) -> dict[str, list[str]]:
        """Every declared option and the plugins that declare it (several may, alike)."""
        out: dict[str, list[str]] = {}
        for plugin, options in self.declarations():
            for opt in options or ():
                out.setdefault(opt.name, []).append(plugin)
        return out

    def adapters(self) -> list[str]:
        return sorted(impl.plugin_name for impl in self._impls("cfm_adapter_serves"))

    def serving(self, argv: list[str]) -> list[str]:
        return sorted(
            impl.plugin_name
            for impl in self._impls("cfm_adapter_serves")
            if impl.function(argv=list(argv))
        )

    def needing_adapter(self, names) -> list[str]:
        return [
            impl.plugin_name
            for impl in self._impls("cfm_needs_adapter")
            if impl.plugin_name in names and impl.function()
        ]


def catalog() -> Catalog:
    """Load every installed plugin (a plugin that fails to import is reported, not fatal here)."""
    pm, plugins, broken = _new_pm(), available_plugins(), {}
    for name, info in plugins.items():
        try:
            pm.register(load_plugin(info), name=name)
        except Exception as exc:  # noqa: BLE001 (a broken plugin must not hide the others)
            broken[name] = f"{type(exc).__name__}: {exc}"
    return Catalog(pm, plugins, broken)


def _command_text(argv) -> str:
    return shlex.join(argv[:3]) + (" ..." if len(argv) > 3 else "")


def enable_serving_adapter(config: Config, cat: Catalog) -> None:
    """Enable the adapter that serves ``config.trainer_argv``; refuse features left without one.

    Without its adapter a feature such as ``binpack`` does nothing, and under several ranks the
    trainer would run once per rank into the same directory; with it, the ranks train one model.
    """
    argv = config.trainer_argv
    if not argv:
        return
    adapters = cat.adapters()
    serving = cat.serving(argv)
    if serving and not any(name in config.enabled for name in serving):
        name = serving[0]
        config.enabled.insert(0, name)
        log.info(
            "the %s adapter serves `%s`: enabled it%s",
            name,
            _command_text(argv),
            f" (also serving: {', '.join(serving[1:])})" if len(serving) > 1 else "",
        )
    if any(name in config.enabled for name in adapters):
        return
    needing = cat.needing_adapter(config.enabled)
    if needing:
        raise MissingAdapterError(
            f"{', '.join(needing)} work(s) through a trainer adapter, and no installed adapter "
            f"serves `{_command_text(argv)}` (installed adapters: "
            f"{', '.join(adapters) or 'none'}). Run a trainer command one of them serves (e.g. `-- "
            "mace_run_train ...`), or install the adapter for your trainer."
        )


#: where an option set on the command line says it came from (config.build_config's labels)
COMMAND_LINE_SOURCES = ("cfm-run -o", "cfm-run --device", "--cfm-")


def check_options_enabled(config: Config, cat: Catalog) -> None:
    """Options read only by plugins that are not enabled would be ignored without a word.

    Set on the command line (``-o``, ``--cfm-...``) they are a usage error (``ValueError``); from
    the environment or a config file's ``cfm_plugins:`` key, where they may serve other runs, a
    warning in ``config.warnings``. Both name the plugin to enable.
    """
    owners = cat.owners()
    unused: dict[tuple[str, ...], list[str]] = {}  # plugins -> options only they read
    for key in config.options:
        plugins = owners.get(key, [])
        if not plugins or CORE in plugins or any(p in config.enabled for p in plugins):
            continue
        unused.setdefault(tuple(plugins), []).append(key)
    errors = []
    for plugins, keys in unused.items():
        wheres = {config.option_sources.get(k, "") for k in keys}
        cli = any(w.startswith(COMMAND_LINE_SOURCES) for w in wheres)
        shown = ", ".join(f"{k}={config.options[k]!r}" for k in keys)
        whose = " or ".join(plugins)
        text = (
            f"cfm-plugins option{'s' if len(keys) > 1 else ''} {shown} (from "
            f"{'; '.join(sorted(w for w in wheres if w)) or 'the caller'}) "
            f"{'are' if len(keys) > 1 else 'is'} read by the {whose} plugin, which is not "
            f"enabled: enable it (--enable {','.join([*config.enabled, plugins[0]])})"
        )
        them = "them" if len(keys) > 1 else "it"
        if cli:
            errors.append(f"{text} or leave {them} out")
        else:
            config.warnings.append(f"{text}; this run ignores {them}")
    if errors:
        raise ValueError("; ".join(errors))


def create_manager(config: Config, cat: Catalog | None = None) -> pluggy.PluginManager:
    """A plugin manager with the enabled plugins of ``config`` registered; also ``config.pm``.

    Raises :class:`UnknownPluginError` naming the unknown plugin and listing the known ones,
    :class:`MissingAdapterError` when enabled features have no adapter for the trainer command,
    and ``ValueError`` for unknown option names, values of the wrong type, and options given on
    the command line for a plugin that is not enabled (:func:`check_options_enabled`).
    """
    cat = cat or catalog()
    known = cat.plugins
    unknown = [n for n in config.enabled if n not in known]
    if unknown:
        raise UnknownPluginError(
            f"unknown cfm-plugins plugin(s): {', '.join(unknown)} (enabled from {config.source}). "
            f"Installed plugins: {', '.join(known) or 'none'}. See `cfm-run --list`."
        )
    for name in config.enabled:
        if name in cat.broken:
            raise ImportError(
                f"cfm-plugins plugin {name} ({known[name].value}) cannot be loaded: "
                f"{cat.broken[name]}"
            )
    enable_serving_adapter(config, cat)
    config.check_options(cat.options())
    check_options_enabled(config, cat)

    pm = _new_pm()
    for name in config.enabled:
        pm.register(cat.pm.get_plugin(name), name=name)
        log.debug("enabled plugin %s (%s)", name, known[name].value)
    pm.check_pending()
    config.pm = pm
    pm.hook.cfm_configure(config=config)
    return pm


@dataclass
class Session:
    """What an adapter carries through the trainer's seams: the configuration (which carries the
    hooks and the ranks as ``config.pm`` and ``config.dist``) and ``trainer``, what the adapter has
    read from the trainer's own arguments so far (batch size, seed, ...), passed on to
    ``cfm_batch_sampler(trainer=...)``; ``train_sampler``, the batch sampler of the training
    loader the trainer iterates (where timed steps are handed over, whose resume state is kept).
    """

    config: Config
    trainer: TrainerSettings = field(default_factory=TrainerSettings)
    train_sampler: object = None

    @property
    def pm(self) -> pluggy.PluginManager:
        return self.config.pm

    @property
    def hook(self):
        return self.config.pm.hook

    @property
    def dist(self):  # cfm_plugins.distributed.DistInfo
        return self.config.dist
