"""Generated Triton source: a small line writer, and the cache that turns source into a module.

Why files: ``@triton.jit`` reads the source of the function it decorates (``inspect.getsource``);
a compiled (non-interpreted) kernel must therefore live in a real file. Each generated source is
written once to ``<cache>/<name>_<sha1>.py`` (the content hash names it, so equal descriptors share
a file and a changed generator never reuses a stale one) and imported from there. The write goes
through a temporary file and ``os.replace``, so MPI ranks that generate the same kernel at the same
time never import a half-written file.

The cache directory is ``$CFM_PLUGINS_TRITON_CACHE`` or ``~/.cache/cfm_plugins/triton``. Modules
are imported once per process and per mode: a module imported under ``TRITON_INTERPRET=1`` holds
interpreted functions, so the interpreter flag is part of the import key.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import weakref
from pathlib import Path

__all__ = [
    "Writer",
    "TableCache",
    "KernelCache",
    "widest_segment",
    "tl_sum",
    "cache_dir",
    "interpreting",
    "load_source",
    "fmt_float",
]

_MODULES: dict[tuple[str, bool], object] = {}


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``: CPU tensors, no
    GPU)."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


def cache_dir() -> Path:
    """Where generated kernel files are written (created on first use)."""
    root = os.environ.get("CFM_PLUGINS_TRITON_CACHE")
    path = Path(root) if root else Path.home() / ".cache" / "cfm_plugins" / "triton"
    path.mkdir(parents=True, exist_ok=True)
    return path


def fmt_float(v: float) -> str:
    """A float literal that round-trips exactly (Triton folds it as a float32 or float64 constant
    according to the tensor it meets, as Python would)."""
    return repr(float(v))


def tl_sum(expr: str, axis: int) -> str:
    """Source of a sum over ``axis``: ``tl.reduce`` with triton's own sum combiner, which is what
    ``tl.sum`` does. The kernels use builtins only (``tl.full`` rather than ``tl.zeros``, this
    rather than ``tl.sum``): the helpers of ``triton.language.standard`` are jitted functions that
    the interpreter can run only when triton was imported under ``TRITON_INTERPRET=1``, and a test
    session (or a user's process) may have imported triton before. The builtin ``tl.reduce`` runs in
    either order (the interpreter maps this combiner to a numpy sum) and compiles to the same
    code."""
    return f"tl.reduce({expr}, {axis}, tl.standard._sum_combine)"


class Writer:
    """Lines of Python with an indentation level: what the generators emit."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0

    def __call__(self, line: str = "") -> None:
        self.lines.append(("    " * self.level + line) if line else "")

    def indent(self) -> Writer:
        self.level += 1
        return self

    def dedent(self) -> Writer:
        self.level -= 1
        return self

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def load_source(name: str, source: str):
    """Import ``source`` as a module (written once to the cache under a content-hash name)."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:20]
    key = (f"{name}_{digest}", interpreting())
    mod = _MODULES.get(key)
    if mod is not None:
        return mod
    path = cache_dir() / f"{key[0]}.py"
    if not path.exists() or path.read_text() != source:
        fd, tmp = tempfile.mkstemp(prefix=f".{key[0]}.", suffix=".py", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(source)
        os.replace(tmp, path)
    modname = f"cfm_plugins_triton_generated.{key[0]}{'_interp' if key[1] else ''}"
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod  # inspect.getsource (used by triton.jit) finds the file through it
    spec.loader.exec_module(mod)
    _MODULES[key] = mod
    return mod


def widest_segment(ptr) -> int:
    """Length of the longest segment of a CSR pointer tensor (edges of the busiest node, nodes of
    the longest chunk): sizes the interpreter's tile. Read on CPU tensors only; on a GPU it is 1
    (the config's tile is used there, and no host synchronisation is wanted)."""
    if ptr.device.type != "cpu" or ptr.numel() < 2:
        return 1
    return int((ptr[1:] - ptr[:-1]).max())


class TableCache:
    """Host tables parsed from an operator's descriptor tensors, cached on the tensors' identity.

    The first launch with a module's descriptor buffers copies them to the host (on a GPU, one
    synchronisation) and parses them; later launches with the same tensors (same objects, same
    version) find the tables without touching the device. A new tensor with the same content (a
    module moved with ``.to()``) parses again and finds the same generated kernel file.
    """

    def __init__(self, parse, size: int = 64):
        self.parse, self.size = parse, size
        self._hits: dict[tuple, tuple] = {}

    def get(self, desc, meta):
        key = tuple(
            (t.data_ptr(), t._version, tuple(t.shape), str(t.device)) for t in desc
        ) + tuple(int(m) for m in meta)
        hit = self._hits.get(key)
        if hit is not None and all(ref() is t for ref, t in zip(hit[0], desc)):
            return hit[1]
        tables = self.parse(desc, meta)
        self._hits[key] = ([weakref.ref(t) for t in desc], tables)
        while len(self._hits) > self.size:
            self._hits.pop(next(iter(self._hits)))
        return tables


class KernelCache:
    """The jitted kernel of each (host tables, kernel, flags), generated once.

    Generating a kernel's source and hashing it (:func:`load_source`) costs host time at every
    launch that does it: 0.26 ms for the conv TP segment kernel of a MACE-MP-medium layer, 0.39 ms
    for its edge kernel (``tools/triton_host.py``), about 30 launches in a force-training step.
    The tables object (from :class:`TableCache`, the same object for the same descriptor tensors)
    keys the cache; it is kept alive with its kernels, so its ``id`` is never reused while cached.
    ``generate(tables, kernel, **flags)`` returns the source; the kernel is the function
    ``name_of(kernel, **flags)`` in it (default ``<prefix>_<kernel>``). The interpreter flag is part
    of the key, as in :func:`load_source`.
    """

    def __init__(self, prefix: str, generate, name_of=None, size: int = 256):
        self.prefix, self.generate, self.size = prefix, generate, size
        self.name_of = name_of or (lambda kernel, **flags: f"{prefix}_{kernel}")
        self._hits: dict[tuple, tuple] = {}

    def get(self, tables, kernel: str, **flags):
        key = (id(tables), kernel, tuple(sorted(flags.items())), interpreting())
        hit = self._hits.get(key)
        if hit is not None and hit[0] is tables:
            return hit[1]
        name = f"{self.prefix}_{kernel}" + "".join(
            f"_{k}{int(v)}" for k, v in sorted(flags.items())
        )
        fn = getattr(
            load_source(name, self.generate(tables, kernel, **flags)), self.name_of(kernel, **flags)
        )
        self._hits[key] = (tables, fn)
        while len(self._hits) > self.size:
            self._hits.pop(next(iter(self._hits)))
        return fn
