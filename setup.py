"""Builds ringreduce._native (native/*.cpp, see native/module.cpp) with the system C++
compiler, and ships the CUDA kernel sources (native/*.cu, *.cuh) inside the package.

The extension is optional by design: without a compiler the package still installs and
the Python issuer runs every call (``python -m ringreduce.info`` says which issuer is in
use). It needs no CUDA headers or libraries at build time (it dlopens them).

The kernels are compiled at run time by cupy (kernels.py), so a wheel must carry their
sources: setuptools' package data cannot reach outside the package, so ``build_py``
copies them to ``ringreduce/native/`` in the build tree (kernels.source_dir looks there
when no ``native/`` lies beside the package, as in an editable checkout).
"""

import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

KERNEL_SOURCES = ("*.cu", "*.cuh")
NATIVE_SOURCES = ["native/driver.cpp", "native/program.cpp", "native/issuer.cpp",
                  "native/program_type.cpp", "native/module.cpp"]
NATIVE_HEADERS = ["native/driver.h", "native/program.h", "native/issuer.h",
                  "native/program_type.h"]
"""The extension's sources; its headers are ``depends`` (a change rebuilds it, and the
sdist carries them), never package data: the wheel needs only the built module."""


class BuildPyWithKernels(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "ringreduce" / "native"
        target.mkdir(parents=True, exist_ok=True)
        for pattern in KERNEL_SOURCES:
            for source in sorted(Path("native").glob(pattern)):
                shutil.copy2(source, target / source.name)


setup(
    cmdclass={"build_py": BuildPyWithKernels},
    ext_modules=[Extension(
        "ringreduce._native", NATIVE_SOURCES, depends=NATIVE_HEADERS, language="c++",
        # hidden: the module exports PyInit__native only (its internals span files now)
        extra_compile_args=["-std=c++17", "-O2", "-Wall", "-Wextra", "-fvisibility=hidden",
                            "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
        libraries=["dl"], optional=True)],
)
