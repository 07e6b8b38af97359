"""Build of packyard's C extension; everything else about the package is in pyproject.toml.

The delta encoder's hot loop (store/pack/_delta.c) and the delta search's window loop
(store/pack/_search.c) compile with the machine's C
compiler and the Python headers, by ``pip install .`` and ``pip install -e .`` alike.
Without the extension packyard runs the pure-Python encoder (same bytes, slower):
``packyard.store.pack.delta.IMPLEMENTATION`` says which one is in use, and CI sets
PACKYARD_REQUIRE_C_DELTA=1 so that a missing extension fails the tests.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "packyard.store.pack._delta",
            sources=["store/pack/_delta.c", "store/pack/_search.c"],
            depends=["store/pack/_delta.h"],
            extra_compile_args=["-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
        ),
    ],
)
