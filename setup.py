"""Builds ringreduce._native (native/issuer.cpp) with the system C++ compiler.

Optional by design: without a compiler the package still installs and the Python
issuer runs every call (``python -m ringreduce.info`` says which issuer is in use).
The extension needs no CUDA headers or libraries at build time (it dlopens them).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "ringreduce._native", ["native/issuer.cpp"], language="c++",
    extra_compile_args=["-std=c++17", "-O2", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
                        "-Wno-cast-function-type"],
    libraries=["dl"], optional=True)])
