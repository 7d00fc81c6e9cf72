"""Declared options: what a plugin reads, its type, default and help, in one place.

Every plugin returns the options it reads from its ``cfm_declare_options()`` hook (see
:mod:`cfm_plugins.hookspec`), the way pytest plugins add theirs in ``pytest_addoption``. From the
declarations the core knows each option's type and default (so a plugin calls
``config.get("max_tokens")`` without repeating the default), ``cfm-run --list`` shows them, and a
name nobody declared (a typo such as ``--cfm-max-token``) is refused at start with the closest
known name instead of being silently ignored.

:class:`TrainerSettings` carries what an adapter learns from the trainer's own arguments (batch
size, seed, dtype, device) to the hooks that need it, as declared fields rather than values
slipped into the options dict.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

#: options that exist no more, with what to do instead: setting one is an error saying so
RETIRED = {
    "fused_deterministic": (
        "the Triton weight gradients are always reduced in a fixed order, reproducible bit for "
        "bit (the atomic adds it chose are gone); drop the option"
    ),
}


class UsageError(ValueError):
    """A setting the user must change, found once the trainer's own arguments are read (e.g. a
    loss weighting the trainer's loss cannot take): cfm-run prints it once, without a traceback,
    and exits 2, as it does for the options it checks before the trainer starts."""


@dataclass(frozen=True)
class Option:
    """One option a plugin reads.

    ``name`` uses underscores (``max_tokens``); users may write dashes. ``type`` converts the
    text of the command line, environment or YAML (``int``, ``float``, ``str``, ``bool``).
    ``default`` may be ``None`` when the plugin computes a default at run time (say so in
    ``help``). ``choices`` restricts a ``str`` option to a few values; ``positive`` a number to
    values > 0 (a capacity, a timeout), so that ``0`` or ``-5`` is refused at start with the other
    bad values instead of failing later inside a trainer or a C++ library.
    """

    name: str
    type: type
    default: object
    help: str
    choices: tuple[str, ...] | None = None
    positive: bool = False

    def convert(self, value, where: str = ""):
        """``value`` as :attr:`type`; a ``ValueError`` naming the option, value and source if
        not."""
        if (
            value is None
            or isinstance(value, self.type)
            and not (self.type is int and isinstance(value, bool))
        ):
            out = value
            if isinstance(out, float):
                out = convert(
                    out, float, self.name
                )  # the finiteness check of text values, for YAML floats too
        else:
            out = convert(value, self.type, self.name)
        src = f" (from {where})" if where else ""
        if self.choices is not None and out is not None and out not in self.choices:
            raise ValueError(
                f"cfm-plugins option {self.name}={value!r}{src}: expected one of "
                f"{', '.join(self.choices)}"
            )
        if self.positive and out is not None and not out > 0:
            default = (
                f" (default {self.default:g})" if isinstance(self.default, (int, float)) else ""
            )
            raise ValueError(
                f"cfm-plugins option {self.name}={value!r}{src}: must be a number > 0{default}"
            )
        return out


def convert(value, type_, name: str):
    """Convert option text to ``type_`` (booleans from 1/0, true/false, yes/no, on/off).

    A float must be finite: no option means anything by ``nan`` or ``inf`` (``float("nan")``
    would pass every ``<= 0`` check and fail far later, after the data is loaded).
    """
    try:
        if type_ is bool:
            text = str(value).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError(value)
        out = type_(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"cfm-plugins option {name}={value!r} is not a valid {type_.__name__}"
        ) from exc
    if type_ is float and not math.isfinite(out):
        raise ValueError(f"cfm-plugins option {name}={value!r} is not a finite number")
    return out


@dataclass(frozen=True)
class DeclaredOption:
    """An :class:`Option` and the plugin that declared it."""

    option: Option
    plugin: str


def collect(declarations) -> dict[str, DeclaredOption]:
    """Merge ``[(plugin_name, [Option, ...]), ...]`` into one table by option name.

    Two plugins may read the same option (e.g. ``device``) only if they declare it alike;
    otherwise the defaults would no longer live in one place, which is an error of the plugins.
    """
    table: dict[str, DeclaredOption] = {}
    for plugin, options in declarations:
        for opt in options or ():
            if not isinstance(opt, Option):
                raise TypeError(
                    f"plugin {plugin}: cfm_declare_options must return Option objects, got {opt!r}"
                )
            seen = table.get(opt.name)
            if seen is not None and (seen.option.type, seen.option.default) != (
                opt.type,
                opt.default,
            ):
                raise ValueError(
                    f"option {opt.name} is declared by {seen.plugin} and by {plugin} with "
                    "different "
                    f"types or defaults ({seen.option.type.__name__}={seen.option.default!r} vs "
                    f"{opt.type.__name__}={opt.default!r})"
                )
            table.setdefault(opt.name, DeclaredOption(opt, plugin))
    return dict(sorted(table.items()))


def closest(name: str, known) -> str | None:
    """The known name closest to ``name`` (difflib), if any is close enough to suggest."""
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return found[0] if found else None


@dataclass(frozen=True)
class TrainerSettings:
    """What an adapter read from the trainer's own arguments, for the hooks that need it.

    ``None`` means the trainer did not say (a plugin then uses its own default). The ``binpack``
    feature sizes its default capacity from ``batch_size``, ``device`` and ``dtype``, and seeds
    its packing with ``seed``. ``kernel_swaps`` names the kernel replacements the trainer makes
    itself (``"cueq"``, ``"oeq"``), which the ``fused`` feature refuses to combine with its own.
    ``loss`` names the trainer's training loss (for messages, e.g. ``"mace_run_train --loss
    huber"``) and ``loss_weightings`` the ``binpack`` loss weightings the adapter can apply to it
    (``"per_sample"`` only where the loss is linear in per-sample weights the adapter can scale).
    """

    batch_size: int | None = None
    seed: int | None = None
    dtype: str | None = None
    device: str | None = None
    kernel_swaps: tuple[str, ...] = ()
    loss: str | None = None
    loss_weightings: tuple[str, ...] = ("stock",)
