"""The optional C extension cusafe._speedups for pip builds: pyproject.toml
holds the rest.  optional=True: without a compiler or Python's headers the
build goes on and the package runs on ctypes alone."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("cusafe._speedups", ["cusafe/_speedups.c"],
                             optional=True)])
