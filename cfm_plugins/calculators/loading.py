"""Loading MACE model files for the calculator, with clear errors for what is not one.

A MACE ``.model`` file (what ``mace_run_train`` writes, or ``torch.save(model)``) is a whole pickled
module, so it is read with ``torch.load(..., weights_only=False)``: unpickling runs code named in
the file, so load only files you trust. :func:`load_mace_weights` is the safe alternative: it reads
a state_dict (``torch.save(model.state_dict(), path)``) or a mace training checkpoint
(``checkpoints/*.pt``, whose ``"model"`` entry is one) with ``torch.load(weights_only=True)``,
which only rebuilds tensors and plain containers, into a model of the same architecture, in the
weights' own dtype (a float64 state_dict loaded into a model built under torch's default float32
would be rounded to float32 without a word: the architecture is built, or converted, in the
weights' dtype first).
mace is imported here only when a model is loaded (``import mace`` first also sets
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``, which e3nn 0.4.4 needs on recent torch; an explicit
``weights_only=True`` still wins over it).
"""

from __future__ import annotations

import contextlib
import copy
import glob
import pickle
import warnings
from pathlib import Path

import torch

EXPECTED = (
    "a whole MACE model pickled with torch.save(model): the .model file written by mace_run_train "
    "(not a checkpoint or a state_dict)"
)

#: attributes every MACE-family model (mace.modules.MACE and its subclasses) carries
MACE_ATTRIBUTES = ("r_max", "atomic_numbers", "interactions", "products")


def check_device(device: str) -> None:
    """Raise a clear error when ``device`` names a CUDA device that this torch cannot use."""
    dev = str(device)
    if not dev.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        built = (
            f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        )
        raise RuntimeError(
            f"device={dev!r} was requested but CUDA is not available (torch {torch.__version__}, "
            f"{built}, {torch.cuda.device_count()} CUDA devices visible); use device='cpu'"
        )
    if ":" in dev and int(dev.split(":", 1)[1]) >= torch.cuda.device_count():
        raise RuntimeError(
            f"device={dev!r} was requested but only {torch.cuda.device_count()} CUDA device(s) "
            "are visible"
        )


def expand_model_paths(model_paths) -> list[Path]:
    """A path, a glob pattern (``mace_*.model``, a committee) or a list of paths -> existing
    files."""
    if isinstance(model_paths, (str, Path)):
        text = str(model_paths)
        matches = (
            sorted(glob.glob(text))
            if glob.has_magic(text)
            else ([text] if Path(text).exists() else [])
        )
        if not matches:
            raise FileNotFoundError(f"no MACE model file at {text!r} (expected {EXPECTED})")
        paths = [Path(p) for p in matches]
    else:
        paths = [Path(p) for p in model_paths]
        if not paths:
            raise ValueError("model_paths is an empty list: give at least one MACE model file")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"no MACE model file at {str(path)!r} (expected {EXPECTED})")
    return paths


def describe(obj) -> str:
    """A short description of what a loaded object is, for error messages."""
    if isinstance(obj, dict):
        keys = list(obj)[:8]
        hint = ""
        if "model" in obj or all(isinstance(v, torch.Tensor) for v in obj.values()):
            hint = (
                " (a training checkpoint or a state_dict: weights without the model; load it with "
                "weights_only=True and architecture=)"
            )
        return f"a {type(obj).__name__} with keys {keys}{'...' if len(obj) > 8 else ''}{hint}"
    if isinstance(obj, torch.nn.Module):
        missing = [a for a in MACE_ATTRIBUTES if not hasattr(obj, a)]
        return (
            f"a torch.nn.Module of class {type(obj).__module__}.{type(obj).__qualname__} "
            f"without the MACE attributes {missing}"
        )
    return f"an object of type {type(obj).__module__}.{type(obj).__qualname__}"


def is_mace_model(obj) -> bool:
    return isinstance(obj, torch.nn.Module) and all(hasattr(obj, a) for a in MACE_ATTRIBUTES)


def check_mace_model(obj, source: str) -> torch.nn.Module:
    """Return ``obj`` if it is a MACE model, else raise TypeError saying what it is."""
    if not is_mace_model(obj):
        raise TypeError(f"{source} is not a MACE model: found {describe(obj)}; expected {EXPECTED}")
    return obj


def load_mace_model(path, device: str = "cpu") -> torch.nn.Module:
    """``torch.load`` one MACE model file onto ``device`` and check that it is one."""
    import mace  # noqa: F401  (before e3nn; makes the pickled mace classes importable)

    check_device(device)
    try:
        obj = torch.load(str(path), map_location=device, weights_only=False)
    except (
        pickle.UnpicklingError,
        RuntimeError,
        EOFError,
        ModuleNotFoundError,
        AttributeError,
    ) as exc:
        raise ValueError(
            f"{str(path)!r} could not be read by torch.load ({type(exc).__name__}: {exc}); "
            f"expected {EXPECTED}"
        ) from exc
    return check_mace_model(obj, repr(str(path)))


WEIGHTS_EXPECTED = (
    "a state_dict saved with torch.save(model.state_dict(), path), or a mace training "
    "checkpoint (checkpoints/*.pt, its 'model' entry)"
)


def weights_from(obj, source: str) -> dict:
    """The state_dict inside what ``torch.load(weights_only=True)`` returned, or TypeError."""
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):  # a mace CheckpointState
        obj = obj["model"]
    if (
        isinstance(obj, dict)
        and obj
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    ):
        return obj
    raise TypeError(
        f"{source} holds {describe(obj)}, not model weights; expected {WEIGHTS_EXPECTED}"
    )


def weights_dtype(weights: dict, source: str) -> torch.dtype | None:
    """The floating-point dtype of a state_dict's tensors (None: it has none); a state_dict that
    mixes two is a ValueError naming them."""
    found = {v.dtype for v in weights.values() if v.is_floating_point()}
    if len(found) > 1:
        counts = {
            _name(d): sum(v.is_floating_point() and v.dtype == d for v in weights.values())
            for d in found
        }
        raise ValueError(
            f"the weights in {source} mix floating-point dtypes ({counts} tensors): a MACE "
            "state_dict has one; save it again from one model (model.state_dict())"
        )
    return found.pop() if found else None


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype | None):
    """torch's default dtype set to ``dtype`` inside the block (None: unchanged)."""
    previous = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def load_mace_weights(path, architecture, device: str = "cpu") -> torch.nn.Module:
    """A MACE model with the weights of ``path``, read with ``torch.load(weights_only=True)``.

    Args:
        path: a state_dict or a mace training checkpoint (see :data:`WEIGHTS_EXPECTED`).
        architecture: a MACE model of the same configuration (copied, not modified), or a
            callable returning one (called with torch's default dtype set to the weights'):
            a state_dict holds numbers only, the modules come from here. A model whose
            parameters are of another dtype than the weights is converted to theirs before they
            are loaded, with a ``UserWarning`` naming both (loading float64 weights into float32
            parameters would round them).
        device: where the weights are loaded.

    A whole pickled model (a ``.model`` file) cannot be read this way; the error says how to
    convert it once, where the file is trusted.
    """
    import mace  # noqa: F401  (before e3nn; the architecture's classes)

    check_device(device)
    source = repr(str(path))
    try:
        obj = torch.load(str(path), map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"{source} cannot be loaded with weights_only=True: it pickles Python objects (a whole "
            "model, as mace_run_train's .model files do), not only weights "
            f"({str(exc).splitlines()[0]}). If you trust the file, load it with "
            "weights_only=False; to get a weights-only file, run once where the file is trusted: "
            "torch.save(torch.load(path, weights_only=False).state_dict(), 'model_weights.pt')"
        ) from exc
    except (RuntimeError, EOFError) as exc:
        raise ValueError(
            f"{source} could not be read by torch.load ({type(exc).__name__}: {exc}); "
            f"expected {WEIGHTS_EXPECTED}"
        ) from exc
    weights = weights_from(obj, source)
    if architecture is None:
        raise ValueError(
            f"{source} holds weights only ({len(weights)} tensors): pass architecture=, a MACE "
            "model of the same configuration (built with the training options, or loaded from a "
            "file you trust), for the weights to be loaded into"
        )
    wanted = weights_dtype(weights, source)
    if callable(architecture) and not isinstance(architecture, torch.nn.Module):
        with default_dtype(wanted):
            model = architecture()
    else:
        model = copy.deepcopy(architecture)
    model = check_mace_model(model, "architecture")
    built = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    if wanted is not None and built is not None and built != wanted:
        narrowing = torch.finfo(built).eps > torch.finfo(wanted).eps
        rounded = f" (loaded into {_name(built)} parameters they would be rounded)"
        warnings.warn(
            f"the weights in {source} are {_name(wanted)} and the architecture's parameters "
            f"{_name(built)}: the architecture is converted to {_name(wanted)} before the weights "
            "are loaded, so that the model is the one the weights are"
            + (rounded if narrowing else "")
            + f"; build the architecture in {_name(wanted)} (torch.set_default_dtype, or pass a "
            "callable, which is called in the weights' dtype) to load without converting",
            stacklevel=2,
        )
        model = model.to(wanted)
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        raise ValueError(
            f"the weights in {source} do not fit the given architecture ({exc}); build the "
            "architecture with the options the weights were trained with"
        ) from exc
    return model.to(device)


def load_mace_models(model_paths, device: str = "cpu") -> list[torch.nn.Module]:
    """Load every model of ``model_paths`` (see :func:`expand_model_paths`)."""
    return [load_mace_model(p, device) for p in expand_model_paths(model_paths)]


def model_dtype(model: torch.nn.Module) -> str:
    """``"float32"`` or ``"float64"``: the dtype of the model's parameters."""
    dtype = next(model.parameters()).dtype
    names = {torch.float32: "float32", torch.float64: "float64"}
    if dtype not in names:
        raise ValueError(f"MACE model parameters are {dtype}; expected float32 or float64")
    return names[dtype]
