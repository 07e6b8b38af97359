"""git's own ``upload-pack`` with the serving configuration packyard's maintenance expects.

packyard serves clones and fetches with git (docs/serving.md): its repacks leave bitmaps, a multi-pack-index
and commit-graphs for git's ``upload-pack`` / ``pack-objects`` to use. :func:`upload_pack_argv` is the one
command line for both the stdio command (``packyard upload-pack``) and smart HTTP (``workers/receive/smarthttp.py``):

* ``uploadpack.allowFilter=true`` (partial clones), ``uploadpack.allowAnySHA1InWant=false`` (only what refs
  reach, and reachable ids are still allowed by v2's default), ``pack.useBitmaps=true`` and
  ``pack.allowPackReuse=true`` (what the bitmaps are for), ``core.multiPackIndex=true`` (the MIDX and its
  bitmap); these override the repository's own config. ``repack.writeBitmaps`` is a repack setting, not a
  serving one: packyard's repack writes the bitmaps itself.
* the hidden refs of pushes (``PACKYARD_RECEIVE_HIDE_REFS``), one ``transfer.hideRefs`` each, so a ref a push
  may not see is not fetched either;
* ``--strict`` on the resolved git directory (never ``<path>/.git`` guessed), ``--timeout`` the receive idle
  time (a silent client is cut off, as pushes are);
* the repository confined to the storage roots (:mod:`packyard.workers.confine`), its alternates too
  (:mod:`packyard.workers.repos`), before git runs; the environment git would use to find another
  repository (``GIT_DIR``, ``GIT_OBJECT_DIRECTORY``, ``GIT_ALTERNATE_OBJECT_DIRECTORIES``...) is dropped.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

#: git's repository-locating environment (``git rev-parse --local-env-vars`` but GIT_CONFIG_PARAMETERS and
#: GIT_PROTOCOL, which a frontend may set on purpose): dropped so git serves the confined repository only.
LOCAL_ENV = ("GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_CONFIG", "GIT_OBJECT_DIRECTORY", "GIT_DIR", "GIT_WORK_TREE",
             "GIT_IMPLICIT_WORK_TREE", "GIT_GRAFT_FILE", "GIT_INDEX_FILE", "GIT_NO_REPLACE_OBJECTS",
             "GIT_REPLACE_REF_BASE", "GIT_PREFIX", "GIT_INTERNAL_SUPER_PREFIX", "GIT_SHALLOW_FILE",
             "GIT_COMMON_DIR", "GIT_NAMESPACE", "GIT_QUARANTINE_PATH")

SERVING_CONFIG = (
    ("uploadpack.allowFilter", "true"),
    ("uploadpack.allowAnySHA1InWant", "false"),
    ("pack.useBitmaps", "true"),
    ("pack.allowPackReuse", "true"),
    ("core.multiPackIndex", "true"),
)


def confined_git_dir(repo_arg: str, s: Any) -> str:
    """The git directory ``repo_arg`` names, inside a storage root with its alternates (StoreError if not)."""
    from packyard.workers.receive.session import open_target

    _path, repo = open_target(repo_arg, s)    # (opening reads objects/info/alternates under the same rule)
    return os.fspath(repo.path)


def upload_pack_argv(git_dir: str, s: Any, *, stateless: bool = False, advertise_refs: bool = False) -> list[str]:
    argv = ["git"]
    for key, value in SERVING_CONFIG:
        argv += ["-c", f"{key}={value}"]
    for pattern in s.receive_hide_refs:
        argv += ["-c", f"transfer.hideRefs={pattern}"]
    argv += ["upload-pack", "--strict", f"--timeout={max(1, int(s.receive_idle_timeout))}"]
    if stateless:
        argv.append("--stateless-rpc")
    if advertise_refs:
        argv.append("--advertise-refs")
    return [*argv, git_dir]


def upload_pack_env(environ: Mapping[str, str], protocol: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if k not in LOCAL_ENV}
    if protocol is not None:
        if protocol:
            env["GIT_PROTOCOL"] = protocol
        else:
            env.pop("GIT_PROTOCOL", None)
    return env
