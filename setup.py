"""Build of the compiled kernels (the package metadata lives in pyproject.toml).

Each folder ``cuda/<kernel>/`` that holds ``bindings_cpu.cpp`` becomes the CPU extension
``cfm_plugins._C_<kernel>`` (pybind11 + OpenMP, no torch headers). Its ``*.cu`` files plus
``bindings_cuda.cpp`` become ``cfm_plugins._C_<kernel>_cuda`` when ``CFM_PLUGINS_CUDA=1`` and nvcc
is found (the CUDA build is opt-in: the package installs and runs on CPU without it).
``cuda/common/`` holds the headers shared by every kernel.

Environment:
  CFM_PLUGINS_CUDA=1          also build the CUDA extensions (needs nvcc and the CUDA runtime)
  CFM_PLUGINS_CUDA_ARCH=80;90 GPU architectures for nvcc (default 80;90)
  CFM_PLUGINS_NO_OPENMP=1     build the CPU kernels single-threaded
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension
from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
CUDA_DIR = ROOT / "cuda"
COMMON = CUDA_DIR / "common"


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def cpu_extensions() -> list:
    exts = []
    openmp = os.environ.get("CFM_PLUGINS_NO_OPENMP") != "1" and sys.platform != "darwin"
    for kdir in sorted(p for p in CUDA_DIR.iterdir() if (p / "bindings_cpu.cpp").exists()):
        sources = [_rel(kdir / "bindings_cpu.cpp")] + [
            _rel(s) for s in sorted(kdir.glob("*_cpu.cpp")) if s.name != "bindings_cpu.cpp"
        ]
        exts.append(
            Pybind11Extension(
                f"cfm_plugins._C_{kdir.name}",
                sources,
                include_dirs=[_rel(COMMON), _rel(kdir)],
                cxx_std=17,
                extra_compile_args=["-O3", "-ffp-contract=off"] + (["-fopenmp"] if openmp else []),
                extra_link_args=(["-fopenmp"] if openmp else []),
            )
        )
    return exts


class BuildExtWithCuda(build_ext):
    """build_ext that also compiles the optional CUDA extensions with nvcc."""

    def run(self):
        super().run()
        if os.environ.get("CFM_PLUGINS_CUDA") == "1":
            self._build_cuda()

    def _build_cuda(self):
        nvcc = shutil.which("nvcc") or str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
        if not Path(nvcc).exists():
            raise RuntimeError("CFM_PLUGINS_CUDA=1 but nvcc was not found (set CUDA_HOME or PATH)")
        import pybind11
        import sysconfig

        archs = os.environ.get("CFM_PLUGINS_CUDA_ARCH", "80;90").split(";")
        gencode = sum((["-gencode", f"arch=compute_{a},code=sm_{a}"] for a in archs), [])
        cuda_home = Path(nvcc).resolve().parent.parent
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        for kdir in sorted(p for p in CUDA_DIR.iterdir() if (p / "bindings_cuda.cpp").exists()):
            name = f"_C_{kdir.name}_cuda"
            out = Path(self.get_ext_fullpath(f"cfm_plugins.{name}"))
            out.parent.mkdir(parents=True, exist_ok=True)
            sources = [str(kdir / "bindings_cuda.cpp")] + [str(s) for s in sorted(kdir.glob("*.cu"))]
            cmd = [
                nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
                *gencode,
                f"-I{COMMON}", f"-I{kdir}", f"-I{pybind11.get_include()}",
                f"-I{sysconfig.get_paths()['include']}",
                *sources, "-o", str(out), f"-L{cuda_home / 'lib64'}", "-lcudart",
            ]
            print(" ".join(cmd))
            subprocess.check_call(cmd)
            if self.inplace:
                dst = ROOT / "cfm_plugins" / (name + suffix)
                if dst.resolve() != out.resolve():
                    shutil.copy2(out, dst)


packages = find_packages(include=["cfm_plugins", "cfm_plugins.*"]) + ["cfm_plugins_adapters"] + \
    [f"cfm_plugins_adapters.{p}" for p in find_packages("adapters")]

setup(
    packages=packages,
    # `adapters/` installs as `cfm_plugins_adapters`: a PyPI package called `adapters` exists.
    package_dir={"cfm_plugins_adapters": "adapters"},
    ext_modules=cpu_extensions(),
    cmdclass={"build_ext": BuildExtWithCuda},
    zip_safe=False,
)
