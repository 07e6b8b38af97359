"""What a pool's repack keeps for its members: every object their refs reach (a member's repack may have
dropped its own copy because the pool has one: git's ``repack -a -d -l``).

The pool's own refs (the members' namespaces that ``fetch`` keeps) say what the pool packs in its main pack and
bitmaps. A member's refs move on their own: a push to a fork builds on whatever the fork reaches, and the
source's force-push (fetched into the pool) can leave pool objects that no pool ref reaches but a fork still
does. :func:`members_reach` walks every member's tips (refs, HEAD, reflogs: what a member's own repack keeps),
reading through the member (its own objects, then the pool), and stops at what the pool's walk already
reached; the repack keeps what it finds as if it were young (in the cruft pack, with the time of this repack),
so it ages out only once no member has reached it for the expiry period. It runs at the plan and again right
before the delete (the recheck), so a member's ref that moved during the repack is honoured too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from ...errors import NotARepositoryError
from ..walk.reach import walk
from ..walk.tips import read_tips
from .layout import read_members


def members_reach(pool_dir: Path, known: Callable[[bytes], bool], *,
                  members: Sequence[Path] | None = None) -> set[bytes]:
    """Every object a member of the pool at ``pool_dir`` reaches that ``known`` does not say is reached already
    (the ids of member-local objects come back too: the caller keeps only the pool's own). ``members``: the
    member git dirs (default: the pool's members file, read now). A member that no longer exists is skipped (a
    deleted fork borrows nothing)."""
    from ...repo import Repository

    found: set[bytes] = set()
    for git_dir in (read_members(pool_dir) if members is None else members):
        try:
            member = Repository.open(git_dir)
        except NotARepositoryError:
            continue
        tips = read_tips(member)
        reach = walk(sorted(tips.items()), member.objects.read, known=lambda oid: known(oid) or oid in found)
        found.update(reach.ids())
    return found


__all__ = ["members_reach"]
