"""One typed configuration from the three places a user can enable plugins.

Sources, highest precedence first (the first one that names plugins decides which are enabled;
options merge, higher precedence winning):

1. the command line of ``cfm-run``: ``--enable binpack,fused`` and ``--option key=value``, and
   ``--cfm-<key>=<value>`` options left in the trainer's own command (removed before it runs);
2. the environment: ``CFM_PLUGINS=binpack,fused`` and ``CFM_<KEY>=<value>`` for options
   (e.g. ``CFM_MAX_TOKENS=3072``);
3. a ``cfm_plugins:`` key in the YAML file given to the trainer as ``--config FILE`` (or in the
   JSON file given as an argument, ``python train.py config.json``, as HydraGNN's scripts take it): either a
   list/comma string of names, or a mapping ``{enable: [...], <option>: <value>, ...}``. The
   key is removed from a copy of the file before the trainer reads it (trainers reject
   unknown keys).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

#: Options every plugin may read; a plugin documents its own in its module docstring.
ENV_PREFIX = "CFM_"
_RESERVED_ENV = {"CFM_PLUGINS", "CFM_PLUGINS_CUDA", "CFM_PLUGINS_CUDA_ARCH", "CFM_PLUGINS_NO_OPENMP",
                 "CFM_PLUGINS_FORCE_TORCH"}


@dataclass
class Config:
    """The enabled plugins and their options, with where each came from."""

    enabled: list[str] = field(default_factory=list)
    options: dict[str, object] = field(default_factory=dict)
    source: str = "none"  # where `enabled` came from: "cli", "env", "config-file" or "none"
    trainer_argv: list[str] = field(default_factory=list)  # the trainer command, --cfm-* removed

    def get(self, key: str, default=None, type=None):
        """Option ``key`` (dashes and underscores are the same) converted with ``type``."""
        key = normalize_key(key)
        if key not in self.options:
            return default
        value = self.options[key]
        if type is None or isinstance(value, type):
            return value
        try:
            if type is bool:
                return str(value).strip().lower() in {"1", "true", "yes", "on"}
            return type(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cfm-plugins option {key}={value!r} is not a valid {type.__name__}") from exc

    def is_enabled(self, name: str) -> bool:
        return name in self.enabled


def normalize_key(key: str) -> str:
    return key.strip().lower().replace("-", "_")


def split_names(value) -> list[str]:
    """``"a, b"`` or ``["a", "b"]`` -> ``["a", "b"]`` (order kept, duplicates and blanks dropped)."""
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
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return i + 1, Path(argv[i + 1])
        if arg.startswith("--config="):
            return i, Path(arg.split("=", 1)[1])
    for i, arg in enumerate(argv[1:], 1):
        if arg.endswith(".json") and not arg.startswith("-") and Path(arg).is_file():
            return i, Path(arg)
    return None


def read_config_file_section(argv: list[str], rewrite: bool = True) -> dict:
    """Read (and strip) the ``cfm_plugins:`` key of the trainer's ``--config`` YAML.

    When the key is present and ``rewrite`` is true, a copy of the file without it is written to
    a temporary directory and ``argv`` is changed in place to point to the copy.
    """
    loc = find_config_file(argv)
    if loc is None or not loc[1].is_file():
        return {}
    import yaml

    pos, path = loc
    with open(path) as fh:
        if path.suffix == ".json":  # YAML would read JSON's 1e-3 as a string
            data = json.load(fh)
        else:
            data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict) or "cfm_plugins" not in data:
        return {}
    section = data.pop("cfm_plugins")
    if isinstance(section, dict):
        section = {normalize_key(k): v for k, v in section.items()}
    else:
        section = {"enable": section}
    if rewrite:
        tmpdir = Path(tempfile.mkdtemp(prefix="cfm_plugins_"))
        copy = tmpdir / path.name
        with open(copy, "w") as fh:
            if path.suffix == ".json":  # the trainer reads it with json.load
                json.dump(data, fh, indent=2)
            else:
                yaml.safe_dump(data, fh, sort_keys=False)
        argv[pos] = str(copy) if argv[pos] == str(path) else f"--config={copy}"
    return section


def build_config(cli_enable=None, cli_options=(), trainer_argv=None, environ=None) -> Config:
    """Merge the three sources into one :class:`Config` (``trainer_argv`` is modified in place)."""
    environ = os.environ if environ is None else environ
    trainer_argv = [] if trainer_argv is None else trainer_argv
    file_section = read_config_file_section(trainer_argv)
    trainer_opts = pop_trainer_options(trainer_argv)

    options: dict[str, object] = {}
    for key, value in file_section.items():
        if key != "enable":
            options[key] = value
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX) and key not in _RESERVED_ENV:
            options[normalize_key(key[len(ENV_PREFIX):])] = value
    options.update(trainer_opts)
    for text in cli_options:
        k, v = parse_option(text)
        options[k] = v

    if cli_enable:
        enabled, source = split_names(cli_enable), "cli"
    elif environ.get("CFM_PLUGINS"):
        enabled, source = split_names(environ["CFM_PLUGINS"]), "env"
    elif file_section.get("enable"):
        enabled, source = split_names(file_section["enable"]), "config-file"
    else:
        enabled, source = [], "none"
    return Config(enabled=enabled, options=options, source=source, trainer_argv=trainer_argv)
