"""One typed configuration from the places a user can enable plugins and set options.

Sources, highest precedence first (:func:`build_config` merges them):

1. the command line of ``cfm-run``: ``--enable binpack,fused``, ``--device`` and ``-o key=value``;
2. ``--cfm-<key>=<value>`` options left in the trainer's own command (removed before it runs);
3. the environment: ``CFM_PLUGINS=binpack,fused`` and ``CFM_<KEY>=<value>`` for options
   (``CFM_PLUGINS_*`` build switches and ``CFM_LOG_LEVEL`` are reserved, not options);
4. a ``cfm_plugins:`` key in the trainer's config file (``--config`` YAML, a JSON argument, or a
   Hydra config; :func:`read_config_file_section`): names, or ``{enable: [...], <option>: ...}``.

The first source that names plugins decides which are enabled; options merge, higher precedence
winning. :attr:`Config.notes` says which source won where one overrides another (cfm-run logs
these). Option names are checked against what the installed plugins declare
(:meth:`Config.check_options`): an unknown name is an error suggesting the closest one.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from cfm_plugins.tempcopy import write_copy

ENV_PREFIX = "CFM_"
#: Environment names under ENV_PREFIX that are not plugin options.
RESERVED_ENV_PREFIX = "CFM_PLUGINS_"  # build and kernel switches: CFM_PLUGINS_CUDA, ..._FORCE_TORCH
RESERVED_ENV = {"CFM_PLUGINS", "CFM_LOG_LEVEL"}
_MISSING = object()


@dataclass
class Config:
    """The enabled plugins and their options, with where each came from.

    ``pm`` is the plugin manager (set by :func:`cfm_plugins.manager.create_manager`) and ``dist``
    the ranks (set by cfm-run once they exist): an adapter's seams reach the hooks as
    ``config.pm.hook``.
    """

    enabled: list[str] = field(default_factory=list)
    options: dict[str, object] = field(default_factory=dict)
    source: str = "none"  # where `enabled` came from: "cli", "env", "config-file" or "none"
    trainer_argv: list[str] = field(default_factory=list)  # the trainer command, --cfm-* removed
    option_sources: dict[str, str] = field(
        default_factory=dict
    )  # option -> where its value came from
    notes: list[str] = field(default_factory=list)  # which source overrode which, for the log
    #: what the user should change or know, found at start (a misspelled ``cfm_plugins:`` key, an
    #: option of a plugin that is not enabled, ...): cfm-run logs them once, as warnings
    warnings: list[str] = field(default_factory=list)
    declared: dict = field(default_factory=dict)  # name -> cfm_plugins.options.DeclaredOption
    pm: object = None  # pluggy.PluginManager
    dist: object = None  # cfm_plugins.distributed.DistInfo
    _said: set = field(default_factory=set, repr=False, compare=False)

    def first_time(self, text: str) -> bool:
        """Whether ``text`` is said for the first time in this run (a trainer that builds the same
        loader twice, as mace builds its training loader, gets its log lines once)."""
        if text in self._said:
            return False
        self._said.add(text)
        return True

    def get(self, key: str, default=_MISSING, type=None):
        """Option ``key`` (dashes and underscores are the same), converted to its type.

        Without ``default`` the declared default is used, without ``type`` the declared type.
        """
        from cfm_plugins.options import convert

        key = normalize_key(key)
        decl = self.declared.get(key)
        if type is None and decl is not None:
            type = decl.option.type
        if key not in self.options:
            if default is _MISSING:
                return decl.option.default if decl is not None else None
            return default
        value = self.options[key]
        if (
            type is None
            or value is None
            or (isinstance(value, type) and not (type is int and isinstance(value, bool)))
        ):
            return value
        return convert(value, type, key)

    def is_enabled(self, name: str) -> bool:
        return name in self.enabled

    @property
    def hook(self):
        return self.pm.hook

    def check_options(self, declared: dict) -> None:
        """Refuse option names no installed plugin declares, and values of the wrong type.

        ``declared`` maps names to :class:`cfm_plugins.options.DeclaredOption`. The error names
        the option, its value, where it came from and the closest known name.
        """
        from cfm_plugins.options import RETIRED, closest

        self.declared = declared
        errors = []
        for key, value in self.options.items():
            where = self.option_sources.get(key, "")
            if key in RETIRED and key not in declared:
                src = f" (from {where})" if where else ""
                errors.append(f"cfm-plugins option {key}={value!r}{src}: {RETIRED[key]}")
                continue
            if key not in declared:
                hint = closest(key, declared)
                errors.append(
                    f"unknown cfm-plugins option {key!r} (value {value!r}"
                    + (f", from {where})" if where else ")")
                    + (f": did you mean {hint!r}?" if hint else "")
                )
                continue
            try:
                declared[key].option.convert(value, where)
            except ValueError as exc:
                errors.append(
                    f"{exc} (from {where})" if where and "(from" not in str(exc) else str(exc)
                )
        if errors:
            text = "; ".join(errors)
            end = " " if text.endswith(("?", ".")) else ". "  # no "?." after a "did you mean"
            raise ValueError(text + end + "`cfm-run --list` shows every option.")


def normalize_key(key: str) -> str:
    return key.strip().lower().replace("-", "_")


def split_names(value) -> list[str]:
    """``"a, b"`` or ``["a", "b"]`` -> ``["a", "b"]`` (order kept, duplicates and blanks
    dropped)."""
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out: list[str] = []
    for item in items:
        name = str(item).strip().lower()
        if name and name not in out:
            out.append(name)
    return out


def parse_option(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ValueError(f"option {text!r} must look like key=value")
    key, value = text.split("=", 1)
    return normalize_key(key), value.strip()


def argv_value(argv: list[str], flags: str | tuple[str, ...]) -> tuple[int, str] | None:
    """Position and value of the first ``FLAG VALUE`` or ``FLAG=VALUE`` in a command line, for a
    flag or any of a tuple of spellings (``("-cn", "--config-name")``)."""
    names = (flags,) if isinstance(flags, str) else tuple(flags)
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return i + 1, argv[i + 1]
            if arg.startswith(name + "="):
                return i, arg.split("=", 1)[1]
    return None


_CFM_ARG = re.compile(r"^--cfm[-_]([A-Za-z0-9_-]+)(?:=(.*))?$")


def pop_trainer_options(argv: list[str]) -> dict[str, str]:
    """Remove ``--cfm-<key>[=| ]<value>`` options from a trainer command line (in place)."""
    found: dict[str, str] = {}
    i = 0
    while i < len(argv):
        m = _CFM_ARG.match(argv[i])
        if not m:
            i += 1
            continue
        key, value = normalize_key(m.group(1)), m.group(2)
        del argv[i]
        if value is None:
            if i >= len(argv) or argv[i].startswith("--"):
                raise ValueError(f"--cfm-{key} needs a value (e.g. --cfm-{key}=...)")
            value = argv.pop(i)
        found[key] = value
    return found


def find_config_file(argv: list[str]) -> tuple[int, Path] | None:
    """Position and path of ``--config FILE`` / ``--config=FILE`` in a trainer command line, else
    of the first existing ``*.json`` argument (``python train.py config.json``, HydraGNN's form)."""
    loc = argv_value(argv, "--config")
    if loc is not None:
        return loc[0], Path(loc[1])
    for i, arg in enumerate(argv[1:], 1):
        if arg.endswith(".json") and not arg.startswith("-") and Path(arg).is_file():
            return i, Path(arg)
    return None


def find_hydra_config(argv: list[str]) -> Path | None:
    """The YAML a Hydra trainer (e.g. ``nequip-train -cn NAME [-cp DIR]``) reads, else None."""
    name = argv_value(argv, ("-cn", "--config-name"))
    if name is None:
        return None
    folder = argv_value(argv, ("-cp", "--config-path"))
    path = Path(folder[1] if folder else ".") / name[1]
    return path if path.suffix in {".yaml", ".yml"} else path.with_name(path.name + ".yaml")


def _point_hydra_to(argv: list[str], copy: Path) -> None:
    """Make ``-cn``/``-cp`` of ``argv`` name ``copy`` (in place)."""
    for names, value in (
        (("-cn", "--config-name"), copy.name),
        (("-cp", "--config-path"), str(copy.parent)),
    ):
        loc = argv_value(argv, names)
        if loc is None:
            argv.extend([names[0], value])
        elif argv[loc[0]].startswith(tuple(n + "=" for n in names)):
            argv[loc[0]] = argv[loc[0]].split("=", 1)[0] + "=" + value
        else:
            argv[loc[0]] = value


#: how close (difflib's ratio) a top-level key of the trainer's config must be to ``cfm_plugins`` to
#: be taken for a misspelling of it: ``cfm_plugin`` (0.95), ``cfm-plugins``, ``cfmplugins`` (0.95),
#: ``cfm_plugns`` (0.95) are; ``plugins`` (0.78) or a trainer's own keys are not
NEAR_KEY_RATIO = 0.8
SECTION_KEY = "cfm_plugins"


def near_section_keys(data: dict) -> list[str]:
    """Top-level keys of a trainer's config that look like a misspelled ``cfm_plugins`` key."""
    import difflib

    out = []
    for key in data:
        if not isinstance(key, str) or key == SECTION_KEY:
            continue
        norm = normalize_key(key)
        if (
            norm == SECTION_KEY
            or difflib.SequenceMatcher(None, norm, SECTION_KEY).ratio() >= NEAR_KEY_RATIO
        ):
            out.append(key)
    return out


def read_config_file_section(argv: list[str], rewrite: bool = True, warnings=None) -> dict:
    """Read (and strip) the ``cfm_plugins:`` key of the trainer's ``--config`` YAML (or of the
    JSON file given as an argument, ``python train.py config.json``, as HydraGNN's scripts take
    it, or of the Hydra config ``-cn NAME [-cp DIR]`` of trainers such as nequip-train). The key
    holds a list/comma string of plugin names, or a mapping ``{enable: [...], <option>: <value>,
    ...}``.

    When the key is present and ``rewrite`` is true, a copy of the file without it is written to
    a temporary directory and ``argv`` is changed in place to point to the copy. Where it is absent
    and a top-level key looks like a misspelling of it (``cfm_plugin:``), a warning saying "did you
    mean" is appended to ``warnings`` (a list): the trainer would run without the plugins.
    Trainers reject unknown keys, hence the copy: one copy per job, removed when the last rank
    exits, also after a failure or a kill (:mod:`cfm_plugins.tempcopy`).
    """
    loc = find_config_file(argv)
    hydra = None
    if loc is None:
        hydra = find_hydra_config(argv)
        loc = (None, hydra) if hydra is not None else None
    if loc is None or not loc[1].is_file():
        return {}
    import yaml

    pos, path = loc
    with open(path) as fh:
        if path.suffix == ".json":  # YAML would read JSON's 1e-3 as a string
            data = json.load(fh)
        else:
            data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        return {}
    if SECTION_KEY not in data:
        near = near_section_keys(data)
        if near and warnings is not None:
            keys = ", ".join(repr(k) for k in near)
            warnings.append(
                f"{path} has no {SECTION_KEY}: key but has {keys}: did you mean "
                f"{SECTION_KEY!r}? That key is not read: it enables no plugin and sets no option "
                f"(rename it to {SECTION_KEY}, or enable the plugins with cfm-run --enable)"
            )
        return {}
    section = data.pop(SECTION_KEY)
    if isinstance(section, dict):
        section = {normalize_key(k): v for k, v in section.items()}
    else:
        section = {"enable": section}
    section["__file__"] = str(path)
    if rewrite:
        # the trainer reads JSON with json.load; one copy per job (cfm_plugins.tempcopy)
        text = (
            json.dumps(data, indent=2)
            if path.suffix == ".json"
            else yaml.safe_dump(data, sort_keys=False)
        )
        copy = write_copy(path.name, text)
        if hydra is not None:
            _point_hydra_to(argv, copy.resolve())
        else:
            argv[pos] = str(copy) if argv[pos] == str(path) else f"--config={copy}"
    return section


def _env_options(environ) -> dict[str, tuple[str, str]]:
    """``CFM_<KEY>`` variables as {key: (value, variable)}, reserved names left out."""
    out = {}
    for var, value in environ.items():
        if (
            var.startswith(ENV_PREFIX)
            and var not in RESERVED_ENV
            and not var.startswith(RESERVED_ENV_PREFIX)
        ):
            out[normalize_key(var[len(ENV_PREFIX) :])] = (value, var)
    return out


def build_config(cli_enable=None, cli_options=(), trainer_argv=None, environ=None) -> Config:
    """Merge the sources into one :class:`Config` (``trainer_argv`` is modified in place)."""
    environ = os.environ if environ is None else environ
    trainer_argv = [] if trainer_argv is None else trainer_argv
    warnings: list[str] = []
    file_section = read_config_file_section(trainer_argv, warnings=warnings)
    file_label = f"the cfm_plugins: key of {file_section.pop('__file__', '--config')}"
    trainer_opts = pop_trainer_options(trainer_argv)

    # lowest precedence first; each later source overrides the earlier ones
    layers = [
        [(k, v, f"{file_label} ({k})") for k, v in file_section.items() if k != "enable"],
        [(k, v, f"the environment ({var})") for k, (v, var) in _env_options(environ).items()],
        [
            (k, v, f"--cfm-{k.replace('_', '-')} in the trainer command")
            for k, v in trainer_opts.items()
        ],
        [(*parse_option(text), "cfm-run -o") for text in cli_options],
    ]
    options: dict[str, object] = {}
    sources: dict[str, str] = {}
    notes: list[str] = []
    for layer in layers:
        for key, value, where in layer:
            if key in options and str(options[key]) != str(value):
                notes.append(
                    f"option {key}={value!r} from {where} overrides {options[key]!r} from "
                    f"{sources[key]}"
                )
            options[key], sources[key] = value, where

    candidates = [
        ("cli", "cfm-run --enable", cli_enable),
        ("env", "the environment (CFM_PLUGINS)", environ.get("CFM_PLUGINS")),
        ("config-file", f"{file_label} (enable)", file_section.get("enable")),
    ]
    enabled, source = [], "none"
    for name, label, raw in candidates:
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            continue
        names = split_names(raw)
        if not names:
            notes.append(
                f"{label} is {raw!r}: it names no plugin, so it enables none and is ignored"
            )
            continue
        if source == "none":
            enabled, source, winner = names, name, label
        elif names != enabled:
            dropped = [n for n in names if n not in enabled]
            notes.append(
                f"plugins from {winner} ({', '.join(enabled)}) override {label} "
                f"({', '.join(names)})" + (f": {', '.join(dropped)} not enabled" if dropped else "")
            )
    return Config(
        enabled=enabled,
        options=options,
        source=source,
        trainer_argv=trainer_argv,
        option_sources=sources,
        notes=notes,
        warnings=warnings,
    )
