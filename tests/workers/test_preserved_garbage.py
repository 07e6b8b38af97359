"""Issue 16: what git says of `objects/pack/preserved/` (packs a repack replaced, kept for readers).

git reads no objects from it, fsck and gc are silent about it, but `git count-objects -v` counts the
directory itself as one piece of garbage (builtin/count-objects.c: every name in objects/pack that is not a
pack file is "garbage found") from the first packyard repack on. Kept where it is (store/objdir.py and the
expiry read it there); docs/operating.md (which README's "Operating safely" points to) quotes git's words,
pinned here."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gitutil import ROOT, git

OPERATING = ROOT / "docs" / "operating.md"


def _history(tmp_path: Path) -> Path:
    """A bare repository with three packs of reachable history, made by git."""
    work = tmp_path / "work"
    git("init", "-q", "-b", "main", str(work))
    for i in range(3):
        (work / f"f{i}").write_text(f"{i}\n" * (i + 1))
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"c{i}", cwd=work)
        git("repack", "-q", "-d", cwd=work)
    bare = tmp_path / "r.git"
    git("clone", "-q", "--bare", "--no-local", str(work), str(bare))
    git("repack", "-q", "-d", git_dir=bare)   # git's own repack leaves no garbage
    return bare


def _count_objects(bare: Path) -> tuple[dict[str, str], str]:
    proc = subprocess.run(["git", "--git-dir", str(bare), "count-objects", "-v"], capture_output=True, text=True,
                          check=True)
    return dict(line.split(": ", 1) for line in proc.stdout.splitlines()), proc.stderr


def test_git_reports_the_preserved_dir_as_one_garbage_entry(tmp_path, pk):
    bare = _history(tmp_path)
    counts, warnings = _count_objects(bare)
    assert (counts["garbage"], counts["size-garbage"], warnings) == ("0", "0", "")
    (work_pack,) = (bare / "objects" / "pack").glob("*.pack")

    for round_ in range(2):   # two repacks: more preserved packs, still one entry (the directory)
        git("hash-object", "-w", "--stdin", git_dir=bare, input=f"loose {round_}\n".encode())
        out = subprocess.run(["packyard", "repack", "--repo", str(bare), "--mode", "full", "--no-progress"],
                             env=pk.cli_env(), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
    preserved = bare / "objects" / "pack" / "preserved"
    assert (preserved / work_pack.name).exists() and len(list(preserved.glob("*.pack"))) == 2

    counts, warnings = _count_objects(bare)
    assert counts["garbage"] == "1"
    assert counts["size-garbage"] == str(preserved.stat().st_size // 1024)
    assert warnings == f"warning: garbage found: {preserved}\n"
    # Nothing else of git minds it: fsck is clean, gc runs and leaves it alone.
    git("fsck", "--full", "--strict", git_dir=bare)
    gc = subprocess.run(["git", "--git-dir", str(bare), "gc", "-q"], capture_output=True, text=True)
    assert gc.returncode == 0 and gc.stderr == "", gc.stderr
    assert preserved.is_dir()

    # docs/operating.md quotes git's exact words (the README's "Operating safely" points there).
    section = OPERATING.read_text().split("**`git count-objects -v` reports preserved packs", 1)[1].split("\n* ", 1)[0]
    quoted = warnings.replace(str(bare), "<repo>").strip()
    assert f"`{quoted}`" in section, quoted
    assert re.search(r"`garbage: 1`.*`size-garbage`", section, re.S)
