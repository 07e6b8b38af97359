"""Build of packyard's C extensions; everything else about the package is in pyproject.toml.

The measured hot loops compile with the machine's C compiler and the Python headers (nothing else:
_walk finds zlib's shared library at import), by ``pip install .`` and ``pip install -e .`` alike.
Each extension is named for what it holds; store/native.py is the one place that loads them (one
accessor each), and each has a pure-Python specification that gives the same bytes:

* ``store.pack._delta``: the delta encoder (_delta.c) and the delta search's window loop (_search.c);
  otherwise _delta_py.py and search.py (``packyard.store.pack.delta.IMPLEMENTATION``);
* ``store.maintenance.walk._walk``: repack's reachability walk, the packs' id index and the object reader
  (_walk*.c); otherwise walk/reach.py and sources.py (``packyard.store.maintenance.walk.reach.IMPLEMENTATION``);
* ``store.pack._packwrite``: the pack writer's copy loop (_packwrite_copy.c) and the .idx/.rev tables
  (_packwrite_idx.c); otherwise writeplan.py and idxwrite.py;
* ``store.maintenance.serving._bitmap``: the reachability bitmaps' closures and EWAH (_bitmap.c, _bitmap_ewah.c);
  otherwise bitmap.py and ewah.py (``packyard.store.maintenance.serving.bitmap.IMPLEMENTATION``);
* ``store.maintenance.serving._bloom``: the commit-graph's Bloom filters and commit reads (_bloom.c); otherwise
  bloom.py and commitgraph.py;
* ``store.fsck._fsck``: fsck's scan of a clean tree (_fsck.c); otherwise store/fsck/rules.py's
  ``check_tree_fast`` (``packyard.store.fsck.rules.IMPLEMENTATION``);
* ``workers.nfsim._nfsimd``: nfsim's simulated NFS client filesystem (_nfsimd.c), the test and benchmark
  tool of docs/nfs.md; otherwise workers/nfsim/fs.py on mfusepy. The one extension that needs more than
  Python's headers: libfuse3's (Debian's libfuse3-dev, found with pkg-config); without them it is left
  out, and a failed build of it does not fail the install (``optional``).

One program besides: ``packyard-receive-pack`` (workers/receive/_handoff_client.c), the client of a stdio push
handed to a running ``packyard http`` (workers/receive/handoff.py, whose ``hand_over`` is its specification and
fallback). It is not an extension: it replaces the ~20 ms a Python interpreter takes to start with ~1 ms
(docs/receive.md, Figures). build_ext links it into its build_temp, and install_scripts puts it beside the
``packyard`` script (in the wheel's scripts, for ``pip install .`` and ``-e`` alike); without a compiler it is
left out and ``packyard receive-pack`` does the same work.

_packwrite, _bitmap and _bloom read objects through _walk's Packs and reader (its C API capsule, see
store/maintenance/walk/_walk.h): without _walk they do not load either. PACKYARD_PURE_PYTHON=1 selects every
fallback; PACKYARD_REQUIRE_C=1 (CI) makes store/native.py raise at import when an extension is missing.
"""
import os
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.install_scripts import install_scripts
from setuptools.dist import Distribution

WARNINGS = ["-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]
WALK_H = ["store/maintenance/walk/_walk.h"]
# the extensions that take _walk's functions from its capsule (store/maintenance/walk/_walk_client.c)
CLIENT = {"define_macros": [("WALK_CLIENT", "1")], "include_dirs": ["store/maintenance/walk"], "depends": WALK_H,
          "extra_compile_args": [*WARNINGS, "-fvisibility=hidden"]}


def nfsim_extension() -> list[Extension]:
    """nfsim's C filesystem, when libfuse3's headers are here (pkg-config fuse3, or Debian's path)."""
    try:
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        if not os.path.exists("/usr/include/fuse3/fuse_lowlevel.h"):
            return []
        flags = ["-I/usr/include/fuse3", "-lfuse3", "-lpthread"]
    return [Extension(
        "packyard.workers.nfsim._nfsimd",
        sources=["workers/nfsim/_nfsimd.c"],
        include_dirs=[f[2:] for f in flags if f.startswith("-I")],
        libraries=[f[2:] for f in flags if f.startswith("-l")],
        extra_compile_args=[*WARNINGS, "-fvisibility=hidden", *(f for f in flags if f.startswith("-D"))],
        optional=True,
    )]


#: programs (not extensions) -> their C sources: linked by build_ext, installed beside the `packyard` script
PROGRAMS = {"packyard-receive-pack": ["workers/receive/_handoff_client.c"]}


def _program_dir(cmd: build_ext) -> str:
    return os.path.join(cmd.build_temp, "programs")


class BuildExt(build_ext):
    """The extensions, then PROGRAMS (a program that does not compile is left out, with a warning)."""

    def run(self) -> None:
        super().run()
        from setuptools.errors import CompileError, LinkError

        for name, sources in PROGRAMS.items():
            try:
                objects = self.compiler.compile(sources, output_dir=self.build_temp, extra_postargs=WARNINGS)
                self.compiler.link_executable(objects, name, output_dir=_program_dir(self))
            except (CompileError, LinkError) as err:
                self.warn(f"{name} not built ({err}): packyard receive-pack does its work")


class InstallScripts(install_scripts):
    """The entry points' scripts, then the PROGRAMS build_ext linked, executable."""

    def run(self) -> None:
        super().run()
        built = _program_dir(self.get_finalized_command("build_ext"))
        for name in PROGRAMS:
            if os.path.exists(os.path.join(built, name)):
                self.mkpath(self.install_dir)
                dest, _ = self.copy_file(os.path.join(built, name), os.path.join(self.install_dir, name))
                os.chmod(dest, 0o755)
                self.outfiles.append(dest)


class WithPrograms(Distribution):
    """install_scripts runs even though no script is listed (setuptools runs it only when one is)."""

    def has_scripts(self) -> bool:
        return True


setup(
    distclass=WithPrograms,
    scripts=[],                # (none: has_scripts above is for PROGRAMS)
    cmdclass={"build_ext": BuildExt, "install_scripts": InstallScripts},
    ext_modules=[
        Extension(
            "packyard.store.pack._delta",
            sources=["store/pack/_delta.c", "store/pack/_search.c"],
            depends=["store/pack/_delta.h"],
            extra_compile_args=WARNINGS,
        ),
        Extension(
            "packyard.store.maintenance.walk._walk",
            sources=["store/maintenance/walk/_walk.c", "store/maintenance/walk/_walk_packs.c",
                     "store/maintenance/walk/_walk_read.c", "store/maintenance/walk/_walk_trees.c"],
            depends=WALK_H,
            extra_compile_args=[*WARNINGS, "-fvisibility=hidden"],
        ),
        Extension(
            "packyard.store.pack._packwrite",
            sources=["store/pack/_packwrite.c", "store/pack/_packwrite_copy.c", "store/pack/_packwrite_idx.c",
                     "store/maintenance/walk/_walk_client.c"],
            **CLIENT,
        ),
        Extension(
            "packyard.store.maintenance.serving._bitmap",
            sources=["store/maintenance/serving/_bitmap.c", "store/maintenance/serving/_bitmap_ewah.c",
                     "store/maintenance/walk/_walk_client.c"],
            **CLIENT,
        ),
        Extension(
            "packyard.store.maintenance.serving._bloom",
            sources=["store/maintenance/serving/_bloom.c", "store/maintenance/walk/_walk_client.c"],
            **CLIENT,
        ),
        Extension(
            "packyard.store.fsck._fsck",
            sources=["store/fsck/_fsck.c"],
            extra_compile_args=["-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"],
        ),
        *nfsim_extension(),
    ],
)
