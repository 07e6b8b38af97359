"""Arguments shared by the CLI commands: ``--repo``, ``--ref-update``, ``--fsck``/``--fsck-skiplist``."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from packyard.workers.cli.failures import CommandFailed


def add_repo_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--repo", metavar="PATH", required=required,
                        help="repository path (bare repository, or a work tree with .git)")


def add_ref_update_arg(parser: argparse.ArgumentParser) -> None:
    """``--ref-update REF:OLD:NEW`` (repeatable; empty OLD = the ref must not exist yet)."""
    parser.add_argument("--ref-update", action="append", default=[], metavar="REF:OLD:NEW",
                        type=_ref_update, help="after the objects are durable, move REF from OLD to NEW "
                        "(compare-and-swap, all or nothing; empty OLD: the ref must not exist)")


def add_fsck_args(parser: argparse.ArgumentParser) -> None:
    """``--fsck MSG=SEV`` (repeatable; git's receive.fsck.<msg-id>) and ``--fsck-skiplist FILE`` (fsck.skipList),
    on top of PACKYARD_FSCK / PACKYARD_FSCK_SKIPLIST; either implies --strict."""
    parser.add_argument("--fsck", action="append", default=[], metavar="MSG=SEV",
                        help="severity of one fsck message id (error, warn or ignore), e.g. "
                        "zeroPaddedFilemode=ignore; implies --strict")
    parser.add_argument("--fsck-skiplist", metavar="FILE", default=None,
                        help="object ids (one a line, git's fsck.skipList) whose findings are ignored")


def fsck_options(args: argparse.Namespace) -> Any:
    """The FsckOptions of ``add_fsck_args`` over the settings' (a bad value ends the command)."""
    from packyard.store.errors import StoreError
    from packyard.workers.commands._bulk import fsck_options_of

    try:
        return fsck_options_of(args.fsck, args.fsck_skiplist)
    except StoreError as err:
        print(f"packyard: {err}", file=sys.stderr)
        raise CommandFailed(str(err)) from err


def _ref_update(item: str) -> dict[str, str | None]:
    parts = item.split(":")
    if len(parts) != 3 or not parts[0] or not parts[2]:
        raise argparse.ArgumentTypeError(f"bad --ref-update {item!r}: want REF:OLD:NEW")
    return {"ref": parts[0], "old": parts[1] or None, "new": parts[2]}
