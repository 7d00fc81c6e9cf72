"""The debug switches of the fused kernels: environment variables, each read once per process.

They are not options (``cfm-run --list``): they exist to take a path apart while debugging or
testing, and a run never needs them. Each is read at its first use (the Triton kernels' set-up
reads ``CFM_PLUGINS_TRITON_UNFILLED``, so that a bad value fails there), never again at a launch;
:func:`reread` makes the next use read them again (tests that set them in a running process).
docs/environment.md lists them with every other variable the project reads.
"""

from __future__ import annotations

import os

__all__ = [
    "CHECK_ONE_HOT_ENV",
    "FORCE_TORCH_ENV",
    "UNFILLED_ENV",
    "check_one_hot",
    "force_torch",
    "unfilled",
    "reread",
]

#: ``1``: the fused modules run their pure-torch evaluation, whatever is built
FORCE_TORCH_ENV = "CFM_PLUGINS_FORCE_TORCH"
#: ``0``: the Triton conv TP zero-fills every output first (default ``1``: not those it stores
#: whole)
UNFILLED_ENV = "CFM_PLUGINS_TRITON_UNFILLED"
#: ``1``: the fused skip connections check that their node attributes are one-hot at every call
#: (default: at each module's first call)
CHECK_ONE_HOT_ENV = "CFM_PLUGINS_CHECK_ONE_HOT"

_READ: dict[str, bool] = {}


def force_torch() -> bool:
    """Whether ``CFM_PLUGINS_FORCE_TORCH=1`` forces the pure-torch fallback."""
    if FORCE_TORCH_ENV not in _READ:
        _READ[FORCE_TORCH_ENV] = os.environ.get(FORCE_TORCH_ENV, "") == "1"
    return _READ[FORCE_TORCH_ENV]


def unfilled() -> bool:
    """Whether the Triton conv TP leaves the outputs it stores whole unfilled
    (``CFM_PLUGINS_TRITON_UNFILLED`` unset or ``1``; ``0`` zero-fills every output).

    Raises:
        ValueError: the variable is set to anything else (naming the value and what is allowed).
    """
    if UNFILLED_ENV not in _READ:
        value = os.environ.get(UNFILLED_ENV, "1").strip()
        if value not in ("", "0", "1"):
            raise ValueError(
                f"{UNFILLED_ENV}={value!r}: use 1 (the default: outputs the kernels store whole "
                "are not zero-filled first) or 0 (every output zero-filled)"
            )
        _READ[UNFILLED_ENV] = value != "0"
    return _READ[UNFILLED_ENV]


def check_one_hot() -> bool:
    """Whether ``CFM_PLUGINS_CHECK_ONE_HOT=1``: the fused skip connections check at every call,
    not only at their first, that the node attributes are a one-hot (one wait for the device per
    call on a GPU)."""
    if CHECK_ONE_HOT_ENV not in _READ:
        _READ[CHECK_ONE_HOT_ENV] = os.environ.get(CHECK_ONE_HOT_ENV, "") == "1"
    return _READ[CHECK_ONE_HOT_ENV]


def reread() -> None:
    """Read every switch again at its next use."""
    _READ.clear()
