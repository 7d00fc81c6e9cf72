"""Build of the compiled kernels as torch operators (the package metadata lives in pyproject.toml).

One library ``cfm_plugins/_C*.so`` registers every operator ``cfm::<kernel>_<pass>`` from the
folders ``cuda/<kernel>/``; with ``CFM_PLUGINS_CUDA=1`` and nvcc, ``cfm_plugins/_C_cuda*.so`` adds
the CUDA kernels (:func:`extensions`). torch's C++ ABI changes between releases, so the library is
built at install time against the installed torch: ``pip install --no-build-isolation`` after
torch (``make venv`` does; docs/architecture.md, "Building the operators"). Without torch or a C++
compiler the package installs without the library, says so, and runs the pure-torch fallback.
Build switches (docs/environment.md):
  CFM_PLUGINS_CUDA=1          also build the CUDA kernels (needs nvcc and the CUDA runtime)
  CFM_PLUGINS_CUDA_ARCH=80;90 GPU architectures for nvcc (default 80;90)
  CFM_PLUGINS_NO_OPENMP=1     build the CPU kernels single-threaded
  CFM_PLUGINS_REQUIRE_BUILD=1 fail the install when the library cannot be built (CI)
  CFM_PLUGINS_BUILD_JOBS=N    compile N sources at a time (default: the CPUs this process may use)
  CFM_PLUGINS_REUSE_LIBRARY=1 take the CPU library an editable build against this torch left
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import setuptools
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

# pyproject.toml's `license = "MIT"` (an SPDX string; the table form is deprecated) needs setuptools
# 77. A build without isolation uses the environment's setuptools (a Python 3.11 venv brings 65):
# say so here rather than fail in setuptools' validation of pyproject.toml.
if int(setuptools.__version__.split(".")[0]) < 77:
    sys.exit(
        "cfm-plugins: building needs setuptools >= 77, this environment has "
        f"{setuptools.__version__}: run `pip install --upgrade 'setuptools>=77' wheel` and install "
        "again (`make venv` does this)."
    )


def build_jobs() -> int:
    """How many sources to compile at a time: CFM_PLUGINS_BUILD_JOBS, else every CPU this process
    may use (each compile against torch's headers takes a core and under 1 GB)."""
    value = os.environ.get("CFM_PLUGINS_BUILD_JOBS", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(
                f"CFM_PLUGINS_BUILD_JOBS={value!r}: give a whole number of jobs, 1 or more"
            )
        return int(value)
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def run_parallel(fn, items: list, jobs: int) -> list:
    """``[fn(x) for x in items]``, ``jobs`` at a time (each call waits on a compiler process)."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(jobs, len(items))) as pool:
        return list(pool.map(fn, items))


ROOT = Path(__file__).resolve().parent
CUDA_DIR = ROOT / "cuda"
COMMON = CUDA_DIR / "common"
KERNEL_DIRS = sorted(
    p for p in CUDA_DIR.iterdir() if p.is_dir() and p != COMMON and any(p.glob("*_ops.cpp"))
)

NO_TORCH_HINT = (
    "cfm-plugins: torch is not importable in this build environment, so the compiled kernels are "
    "NOT built and the pure-torch fallback will run. Install torch first, then install "
    "cfm-plugins with `pip install --no-build-isolation -e .` (what `make venv` does)."
)


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _torch_flags():
    """Include/library paths and flags of the installed torch, or None when torch is absent."""
    try:
        import torch
        from torch.utils.cpp_extension import include_paths, library_paths
    except ImportError:
        return None
    libs = library_paths()
    return dict(
        include_dirs=include_paths(),
        library_dirs=libs,
        libraries=["c10", "torch", "torch_cpu"],
        define_macros=[
            ("_GLIBCXX_USE_CXX11_ABI", str(int(torch._C._GLIBCXX_USE_CXX11_ABI))),
            ("CFM_TORCH_VERSION", f'"{torch.__version__}"'),
        ],
        extra_link_args=[f"-Wl,-rpath,{d}" for d in libs],
    )


def extensions() -> list:
    """The extensions to build: none without torch (or an error with CFM_PLUGINS_REQUIRE_BUILD=1).

    ``cfm_plugins._C`` registers every operator ``cfm::<kernel>_<pass>`` (schemas, CPU and Meta
    kernels, C++ autograd) from each folder ``cuda/<kernel>/``: its ``*_ops.cpp`` (the binding
    layer, against torch headers) and its ``*_cpu.cpp`` kernels (OpenMP unless
    CFM_PLUGINS_NO_OPENMP=1, no torch headers). With CFM_PLUGINS_CUDA=1, ``cfm_plugins._C_cuda``
    adds the CUDA kernels: ``*.cu`` compiled by nvcc without torch headers
    (:meth:`BuildExt._nvcc_objects`), registered by ``*_ops_cuda.cpp``. ``cuda/common/`` holds the
    shared headers. Neither is a Python module: ``cfm_plugins.ops._library`` loads the libraries
    with ``torch.ops.load_library``, and a C++ program (LAMMPS) loads them with ``dlopen``.
    pyproject.toml never lists torch as a build requirement: an isolated build would pull a
    second, unpinned, multi-GB torch."""
    flags = _torch_flags()
    if flags is None:
        if os.environ.get("CFM_PLUGINS_REQUIRE_BUILD") == "1":
            raise RuntimeError(NO_TORCH_HINT)
        print(NO_TORCH_HINT, file=sys.stderr)
        return []
    openmp = os.environ.get("CFM_PLUGINS_NO_OPENMP") != "1" and sys.platform != "darwin"
    cflags = ["-std=c++20", "-O3", "-ffp-contract=off", "-fvisibility=hidden"] + (
        ["-fopenmp"] if openmp else []
    )
    includes = [_rel(COMMON)] + [_rel(k) for k in KERNEL_DIRS] + flags["include_dirs"]
    common = dict(
        include_dirs=includes,
        library_dirs=flags["library_dirs"],
        libraries=flags["libraries"],
        define_macros=flags["define_macros"],
        language="c++",
    )
    cpu_sources = [
        _rel(s)
        for k in KERNEL_DIRS
        for s in sorted(k.glob("*_ops.cpp")) + sorted(k.glob("*_cpu.cpp"))
    ]
    exts = [
        Extension(
            "cfm_plugins._C",
            cpu_sources,
            extra_compile_args=cflags,
            extra_link_args=flags["extra_link_args"] + (["-fopenmp"] if openmp else []),
            **common,
        )
    ]
    if os.environ.get("CFM_PLUGINS_CUDA") == "1":
        cuda_sources = [_rel(s) for k in KERNEL_DIRS for s in sorted(k.glob("*_ops_cuda.cpp"))]
        exts.append(
            Extension(
                "cfm_plugins._C_cuda",
                cuda_sources,
                extra_compile_args=cflags,
                extra_link_args=flags["extra_link_args"],
                **common,
            )
        )
    return exts


class BuildExt(build_ext):
    """build_ext that compiles the CUDA sources with nvcc for ``_C_cuda`` and, for the CPU library,
    turns a compiler failure into a clear message and the pure-torch fallback."""

    def build_extensions(self):
        # One source per compiler call, several calls at a time: setuptools compiles the sources of
        # an extension one after another (the CPU library on 2 cores: 77 s so, 54 s with 2 jobs).
        compile_one, jobs = self.compiler.compile, build_jobs()

        def compile_parallel(sources, *args, **kwargs):
            return [
                o
                for objs in run_parallel(
                    lambda src: compile_one([src], *args, **kwargs), list(sources), jobs
                )
                for o in objs
            ]

        self.compiler.compile = compile_parallel
        super().build_extensions()

    def build_extension(self, ext):
        if ext.name.endswith("_C_cuda"):
            ext.extra_objects = self._nvcc_objects()
            home = self._cuda_home()
            ext.library_dirs = list(ext.library_dirs) + [str(home / "lib64"), str(home / "lib")]
            ext.libraries = list(ext.libraries) + ["cudart"]
            return super().build_extension(ext)
        if self._reuse_library(ext):
            return
        try:
            super().build_extension(ext)
            self._stamp(ext)
        except Exception as exc:  # CompileError, LinkError, missing compiler
            if os.environ.get("CFM_PLUGINS_REQUIRE_BUILD") == "1":
                raise
            print(
                f"cfm-plugins: building {ext.name} failed ({exc}); the package installs WITHOUT "
                "the compiled kernels and runs the pure-torch fallback. Install a C++20 compiler "
                "(g++ >= 10) and reinstall with `pip install --no-build-isolation -e .`.",
                file=sys.stderr,
            )

    @staticmethod
    def _in_tree(ext) -> tuple[Path, Path]:
        """(the library in the source tree, its stamp: the torch it was built against)."""
        import torch

        name = ext.name.split(".")[-1] + sysconfig.get_config_var("EXT_SUFFIX")
        lib = ROOT / "cfm_plugins" / name
        return lib, lib.with_name(lib.name + f".torch-{torch.__version__}")

    def _stamp(self, ext) -> None:
        """Mark the library this build put in the source tree (an editable install) with the torch
        it was built against, for CFM_PLUGINS_REUSE_LIBRARY."""
        lib, stamp = self._in_tree(ext)
        if self.inplace or getattr(self, "editable_mode", False):  # the library goes to the tree
            for old in lib.parent.glob(lib.name + ".torch-*"):
                old.unlink()
            stamp.touch()

    def _reuse_library(self, ext) -> bool:
        """With CFM_PLUGINS_REUSE_LIBRARY=1, take the source tree's library instead of compiling it
        again, where a build against this torch left it there and no source changed since (the
        venvs of `make test-all` share one checkout and one torch)."""
        if os.environ.get("CFM_PLUGINS_REUSE_LIBRARY") != "1":
            return False
        lib, stamp = self._in_tree(ext)
        if not (lib.exists() and stamp.exists()):
            return False
        newest = max(p.stat().st_mtime for k in KERNEL_DIRS + [COMMON] for p in k.iterdir())
        if newest > stamp.stat().st_mtime:
            return False
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.resolve() != lib.resolve():
            shutil.copy2(lib, target)
        print(f"cfm-plugins: reusing {lib.name} (built against this torch)", file=sys.stderr)
        return True

    def _cuda_home(self) -> Path:
        """The CUDA toolkit whose runtime to link: CUDA_HOME, nvcc's own tree, or
        /usr/local/cuda."""
        candidates = [
            os.environ.get("CUDA_HOME"),
            str(Path(self._nvcc()).resolve().parent.parent),
            "/usr/local/cuda",
        ]
        for c in filter(None, candidates):
            if any((Path(c) / sub / "libcudart.so").exists() for sub in ("lib64", "lib")):
                return Path(c)
        raise RuntimeError(
            f"CFM_PLUGINS_CUDA=1 but libcudart.so was not found under {candidates} (set CUDA_HOME)"
        )

    def _nvcc(self) -> str:
        nvcc = shutil.which("nvcc") or str(
            Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
        )
        if not Path(nvcc).exists():
            raise RuntimeError("CFM_PLUGINS_CUDA=1 but nvcc was not found (set CUDA_HOME or PATH)")
        return nvcc

    def _nvcc_objects(self) -> list[str]:
        """The *.cu kernels compiled by nvcc (no torch headers: raw pointers and a stream)."""
        archs = os.environ.get("CFM_PLUGINS_CUDA_ARCH", "80;90").split(";")
        gencode = sum((["-gencode", f"arch=compute_{a},code=sm_{a}"] for a in archs), [])
        commands = []  # (nvcc command, object file)
        for kdir in KERNEL_DIRS:
            for src in sorted(kdir.glob("*.cu")):
                obj = Path(self.build_temp) / "cuda" / (src.stem + ".o")
                obj.parent.mkdir(parents=True, exist_ok=True)
                command = [
                    self._nvcc(),
                    "-c",
                    "-O3",
                    "-std=c++17",
                    "-Xcompiler",
                    "-fPIC",
                    "--expt-relaxed-constexpr",
                    *gencode,
                    f"-I{COMMON}",
                    f"-I{kdir}",
                    str(src),
                    "-o",
                    str(obj),
                ]
                commands.append((command, str(obj)))

        def nvcc(command_obj):
            command, obj = command_obj
            print(
                " ".join(command) + "\n", end="", flush=True
            )  # one write: parallel compiles, whole lines
            subprocess.check_call(command)
            return obj

        return run_parallel(nvcc, commands, build_jobs())


packages = (
    find_packages(include=["cfm_plugins", "cfm_plugins.*"])
    + ["cfm_plugins_adapters"]
    + [f"cfm_plugins_adapters.{p}" for p in find_packages("adapters")]
)

setup(
    packages=packages,
    # `adapters/` installs as `cfm_plugins_adapters`: a PyPI package called `adapters` exists.
    package_dir={"cfm_plugins_adapters": "adapters"},
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
