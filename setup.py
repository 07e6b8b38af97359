"""Build of packyard's C extensions; everything else about the package is in pyproject.toml.

Three hot loops compile with the machine's C compiler and the Python headers (nothing else:
the walk finds zlib's shared library at import), by ``pip install .`` and ``pip install -e .``
alike:

* the delta encoder (store/pack/_delta.c) and the delta search's window loop
  (store/pack/_search.c); without them packyard runs the pure-Python encoder and search
  (same bytes, slower): ``packyard.store.pack.delta.IMPLEMENTATION`` says which one is in use;
* repack's reachability walk (store/maintenance/_walk.c); without it the pure-Python walk
  (same lists, slower): ``packyard.store.maintenance.walk.IMPLEMENTATION``; the same extension
  computes the commit-graph's Bloom filters (store/maintenance/_walk_bloom.c; bloom.py otherwise);
* fsck's scan of a clean tree (store/fsck/_fsck.c); without it store/fsck/rules.py's
  ``check_tree_fast`` in Python (same verdicts): ``packyard.store.fsck.rules.IMPLEMENTATION``.

PACKYARD_PURE_PYTHON=1 selects the fallbacks; CI sets PACKYARD_REQUIRE_C_DELTA=1 so that a
missing extension fails the tests.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "packyard.store.pack._delta",
            sources=["store/pack/_delta.c", "store/pack/_search.c", "store/pack/_idx.c"],
            depends=["store/pack/_delta.h"],
            extra_compile_args=["-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
        ),
        Extension(
            "packyard.store.maintenance._walk",
            sources=["store/maintenance/_walk.c", "store/maintenance/_walk_packs.c",
                     "store/maintenance/_walk_read.c", "store/maintenance/_walk_trees.c",
                     "store/maintenance/_walk_copy.c", "store/maintenance/_walk_bitmap.c",
                     "store/maintenance/_walk_ewah.c", "store/maintenance/_walk_bloom.c"],
            depends=["store/maintenance/_walk.h"],
            extra_compile_args=["-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers", "-fvisibility=hidden"],
        ),
        Extension(
            "packyard.store.fsck._fsck",
            sources=["store/fsck/_fsck.c"],
            extra_compile_args=["-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"],
        ),
    ],
)
