"""The planning strategy, table-driven: every threshold below, at and above its boundary. No disk.

The statistics are built by hand (RepoStats is a plain frozen dataclass); the strategy is a pure
function, so each row states the whole input and the one action it must give.
"""
from __future__ import annotations

import dataclasses
import math

import pytest

from packyard.store.maintenance.planning.poolstats import PoolRole, PoolStats
from packyard.store.maintenance.planning.stats import PackInfo, RepackHistory, RepoStats, geometric_split
from packyard.store.maintenance.planning.strategy import (
    DAY,
    Action,
    MaintenancePolicy,
    allowed_outside,
    plan_maintenance,
)

NOW = 1_800_000_000.0
MIB = 1 << 20
POLICY = MaintenancePolicy()
RECENT_FULL = RepackHistory(last_full_repack_at=NOW - DAY, last_repack_at=NOW - DAY)


def pack(objects: int, size: int | None = None, *, keep: bool = False, cruft: bool = False,
         cruft_oldest: float | None = None, bitmap: str | None = None, n: list[int] = [0]) -> PackInfo:  # noqa: B006 (n: the names' counter)
    n[0] += 1
    return PackInfo(name=f"pack-{n[0]:040x}", pack_bytes=size if size is not None else objects * 100,
                    objects=objects, mtime=NOW - 3600, keep=keep, cruft=cruft, cruft_oldest=cruft_oldest,
                    bitmap=bitmap)


def stats(packs=(), loose: int = 0, history: RepackHistory = RECENT_FULL, **kw) -> RepoStats:
    """``loose`` is the estimate wanted: the sample holds loose * 16 / 256 objects."""
    assert loose % 16 == 0, "the estimate is a multiple of 256/16"
    return RepoStats(path="/srv/r.git", gathered_at=NOW, packs=tuple(packs), loose_sampled=loose // 16,
                     loose_sample_dirs=16, history=history, **kw)


def progression(k: int, base: int = 1) -> list[PackInfo]:
    """k packs whose object counts double (1, 2, 4, ...): none outside the progression."""
    return [pack(base << i) for i in range(k)]


def smalls(k: int, big: int = 10_000_000, big_size: int = MIB // 2) -> list[PackInfo]:
    """One big pack and k one-object packs: git's split merges the k small ones."""
    return [pack(big, big_size)] + [pack(1, 100) for _ in range(k)]


# -- git's geometric split ------------------------------------------------------------------------

@pytest.mark.parametrize("weights,factor,merged", [
    ([], 2, 0),
    ([5], 2, 0),
    ([1, 2, 4, 8], 2, 0),              # already a progression
    ([1, 1], 2, 2),
    ([1, 1, 1, 1000], 2, 3),           # the small ones are merged, the big one stays
    ([3, 4, 100], 2, 2),
    ([1, 100], 2, 0),
    ([10, 11, 12, 13, 80], 2, 5),      # rolled forward: 80 < 2 * (10+11+12+13)
    ([10, 11, 12, 13, 1000], 2, 4),
    ([1, 2, 3, 100], 3, 3),            # factor 3: 2 < 3*1
])
def test_geometric_split_is_gits(weights, factor, merged):
    assert geometric_split(weights, factor) == merged


def test_allowed_outside_is_gitalys_formula():
    assert allowed_outside(0) == 2.0 and allowed_outside(MIB) == 2.0
    assert allowed_outside(1024 * MIB) == pytest.approx(math.log(1024) / math.log(1.8))
    assert allowed_outside(int(1.8 ** 2 * MIB)) == pytest.approx(2.0)   # where the log takes over


# -- the strategy's boundaries ----------------------------------------------------------------------

LOOSE = POLICY.loose_objects_limit           # 1024
CASES = [
    # (name, stats, action)
    ("empty repository", stats(), Action.NOTHING),
    # loose objects: >= 1,024 → loose
    ("loose below", stats(progression(2), loose=LOOSE - 16), Action.NOTHING),
    ("loose at", stats(progression(2), loose=LOOSE), Action.LOOSE),
    ("loose above", stats(progression(2), loose=LOOSE + 16), Action.LOOSE),
    # packs outside the progression > max(2, log(MiB)/log 1.8); tiny total → 2 allowed
    ("outside 2 of small", stats(smalls(1)), Action.NOTHING),       # big + 1 small: split merges 0
    ("outside at 2", stats(smalls(2)), Action.NOTHING),
    ("outside above 2", stats(smalls(3)), Action.GEOMETRIC),
    # 1 GiB in the big pack: log(1024)/log(1.8) = 11.8 allowed
    ("outside 11 of 1 GiB", stats(smalls(11, big_size=1024 * MIB)), Action.NOTHING),
    ("outside 12 of 1 GiB", stats(smalls(12, big_size=1024 * MIB)), Action.GEOMETRIC),
    # .keep and cruft packs are outside the progression's accounting
    ("keep packs not counted", stats(smalls(2) + [pack(1, keep=True) for _ in range(5)]), Action.NOTHING),
    # full: due after 5 days, and only when warranted
    ("full not due (5d - 1s)", stats(smalls(3), history=RepackHistory(NOW - 5 * DAY + 1, NOW - DAY)),
     Action.GEOMETRIC),
    ("full due at 5d", stats(smalls(3), history=RepackHistory(NOW - 5 * DAY, NOW - DAY)), Action.FULL),
    ("full never done", stats(smalls(3), history=RepackHistory()), Action.FULL),
    ("full due but unwarranted", stats(progression(3), history=RepackHistory()), Action.NOTHING),
    # gc.autoPackLimit 50: more than 50 → full when due, else geometric
    ("50 packs", stats(progression(50), history=RepackHistory()), Action.NOTHING),
    ("51 packs", stats(progression(51), history=RepackHistory()), Action.FULL),
    ("51 packs, full on cooldown, progression", stats(progression(51)), Action.NOTHING),
    ("51 packs, full on cooldown, small ones", stats(smalls(50)), Action.GEOMETRIC),
    # cruft expiry: a cruft pack holding objects older than the expiry warrants a full repack
    ("cruft younger than expiry", stats([pack(100), pack(5, cruft=True, cruft_oldest=NOW - 14 * DAY + 1)],
                                        history=RepackHistory()), Action.NOTHING),
    ("cruft at expiry", stats([pack(100), pack(5, cruft=True, cruft_oldest=NOW - 14 * DAY)],
                              history=RepackHistory()), Action.FULL),
    ("cruft expired, full on cooldown", stats([pack(100), pack(5, cruft=True, cruft_oldest=NOW - 20 * DAY)]),
     Action.NOTHING),
    # reachability bitmaps: none (or one not matching its pack) warrants a full repack when one is due
    ("bitmap ok", stats([pack(100, bitmap="ok")], history=RepackHistory()), Action.NOTHING),
    ("bitmap ok beside a new pack", stats([pack(100, bitmap="ok"), pack(1, bitmap="missing")],
                                          history=RepackHistory()), Action.NOTHING),
    ("bitmap missing", stats([pack(100, bitmap="missing")], history=RepackHistory()), Action.FULL),
    ("bitmap missing, full on cooldown", stats([pack(100, bitmap="missing")]), Action.NOTHING),
    ("bitmap of another pack", stats([pack(100, bitmap="bitmap names pack 00ff")], history=RepackHistory()),
     Action.FULL),
    ("only a keep pack's bitmap missing", stats([pack(100, keep=True, bitmap="missing")],
                                                history=RepackHistory()), Action.NOTHING),
    ("bitmap not looked at", stats([pack(100)], history=RepackHistory()), Action.NOTHING),
    # leftovers → gc, when nothing else is due
    ("stale tmp objects", stats(progression(1), stale_tmp_objects=1), Action.GC),
    ("stale pack temps", stats(progression(1), stale_pack_temps=2), Action.GC),
    ("stale quarantine", stats(progression(1), stale_quarantines=1), Action.GC),
    ("preserved before delay", stats(progression(1), preserved_at=(NOW - 3599,)), Action.NOTHING),
    ("preserved at delay", stats(progression(1), preserved_at=(NOW - 3600,)), Action.GC),
    # priorities: full > geometric > loose > gc
    ("geometric beats loose", stats(smalls(3), loose=LOOSE), Action.GEOMETRIC),
    ("loose beats gc", stats(progression(1), loose=LOOSE, stale_tmp_objects=3), Action.LOOSE),
    ("full beats everything", stats(smalls(3), loose=LOOSE, stale_quarantines=1, history=RepackHistory()),
     Action.FULL),
]


@pytest.mark.parametrize("name,s,action", CASES, ids=[c[0] for c in CASES])
def test_plan_boundaries(name, s, action):
    plan = plan_maintenance(s, POLICY, NOW)
    assert plan.action is action, (name, plan.reasons)
    assert plan.reasons and all(isinstance(r, str) and r for r in plan.reasons)
    assert plan_maintenance(s, POLICY, NOW) == plan  # pure: same input, same plan


def test_reasons_say_why_in_numbers():
    plan = plan_maintenance(stats(progression(2), loose=2048), POLICY, NOW)
    assert plan.action is Action.LOOSE and plan.param("mode") == "loose"
    assert plan.reasons == ("~2,048 loose objects (estimated from 128 in 16 of 256 fan-out directories) >= 1,024",)

    plan = plan_maintenance(stats(smalls(3)), POLICY, NOW)
    assert plan.action is Action.GEOMETRIC and dict(plan.params) == {"mode": "geometric", "factor": 2}
    assert plan.reasons[0].startswith("3 of 4 packs outside the geometric progression (factor 2) > 2.0 allowed")

    plan = plan_maintenance(stats(smalls(3), history=RepackHistory(NOW - 6 * DAY, NOW - 6 * DAY)), POLICY, NOW)
    assert plan.action is Action.FULL and dict(plan.params) == {"mode": "full", "expire": 14 * 86400}
    assert "last full repack 6.0 days ago (at most every 5.0 days)" in plan.reasons

    plan = plan_maintenance(stats(progression(3)), POLICY, NOW)
    assert plan.action is Action.NOTHING
    assert plan.reasons[0] == "~0 loose objects < 1,024"


def test_bitmap_reasons_name_the_pack():
    p = pack(100, bitmap="bitmap names pack 00ff")
    plan = plan_maintenance(stats([p], history=RepackHistory()), POLICY, NOW)
    assert plan.action is Action.FULL and plan.reasons[0] == f"{p.name}.bitmap does not match its pack " \
        f"(bitmap names pack 00ff)"
    plan = plan_maintenance(stats([pack(100, bitmap="missing")]), POLICY, NOW)
    assert plan.action is Action.NOTHING and any("no reachability bitmap" in r for r in plan.reasons)


def test_what_is_not_chosen_is_deferred_not_forgotten():
    plan = plan_maintenance(stats(smalls(3), loose=LOOSE, stale_tmp_objects=2), POLICY, NOW)
    assert plan.action is Action.GEOMETRIC
    assert any("loose objects" in d for d in plan.deferred)
    assert any("tmp_obj_" in d for d in plan.deferred)


def test_policy_thresholds_are_the_policys():
    strict = dataclasses.replace(POLICY, loose_objects_limit=64, full_repack_interval=DAY / 2)
    assert plan_maintenance(stats(progression(1), loose=64), strict, NOW).action is Action.LOOSE
    assert plan_maintenance(stats(smalls(3)), strict, NOW).action is Action.FULL  # last full a day ago


def test_plan_as_dict_is_json_ready():
    import json

    plan = plan_maintenance(stats(smalls(3), history=RepackHistory()), POLICY, NOW)
    d = json.loads(json.dumps(plan.as_dict()))
    assert d["action"] == "full" and d["params"]["mode"] == "full" and d["reasons"] == list(plan.reasons)
    s = stats(smalls(3)).as_dict()
    assert s["packs"] == 4 and s["packs_outside_progression"] == 3 and s["since_full_repack"] == DAY


# -- the multi-pack-index (issue 19) ---------------------------------------------------------------

from packyard.store.maintenance.serving.midx import MidxStatus  # noqa: E402

MIDX_CASES = [
    # (name, stats, action, reason fragment)
    ("midx not gathered", stats(progression(3)), Action.NOTHING, None),
    ("midx fresh", stats(progression(3), midx=MidxStatus(True, 3)), Action.NOTHING, None),
    ("midx missing, one pack", stats(progression(1), midx=MidxStatus(False, 1)), Action.NOTHING, None),
    ("midx missing, two packs", stats(progression(2), midx=MidxStatus(False, 2)), Action.GEOMETRIC,
     "multi-pack-index missing over 2 packs"),
    ("midx missing, a keep pack and one", stats([pack(100, keep=True), pack(10)], midx=MidxStatus(False, 2)),
     Action.NOTHING, None),
    ("midx missing, a cruft pack and one", stats([pack(100), pack(5, cruft=True, cruft_oldest=NOW)],
                                                 midx=MidxStatus(False, 2)), Action.NOTHING, None),
    ("midx names a gone pack", stats(progression(2), midx=MidxStatus(True, 2, gone=("pack-" + "1" * 40,))),
     Action.GEOMETRIC, "names 1 pack(s) that are gone"),
    ("midx misses packs", stats(progression(3), midx=MidxStatus(True, 3, missed=("pack-" + "2" * 40,))),
     Action.GEOMETRIC, "misses 1 of 3 installed packs"),
    ("midx stale, one pack left", stats(progression(1), midx=MidxStatus(True, 1, gone=("pack-" + "3" * 40,))),
     Action.GEOMETRIC, "stale"),
    ("loose repack writes it", stats(progression(2), loose=LOOSE, midx=MidxStatus(False, 2)), Action.LOOSE,
     "(the loose repack writes one)"),
    ("midx beats gc", stats(progression(2), stale_tmp_objects=1, midx=MidxStatus(False, 2)), Action.GEOMETRIC,
     "missing"),
    ("full beats midx", stats(smalls(3), history=RepackHistory(), midx=MidxStatus(False, 4)), Action.FULL, None),
]


@pytest.mark.parametrize("name,s,action,why", MIDX_CASES, ids=[c[0] for c in MIDX_CASES])
def test_midx_missing_or_stale_is_a_reason(name, s, action, why):
    plan = plan_maintenance(s, POLICY, NOW)
    assert plan.action is action, (name, plan.reasons)
    if why is not None:
        assert any(why in r for r in plan.reasons), plan.reasons
    else:
        assert not any("multi-pack-index" in r for r in plan.reasons), plan.reasons


def test_gathered_stats_see_the_midx(tmp_path):
    from gitutil import git
    from packyard.store.maintenance.planning.stats import gather_stats
    from packyard.store.maintenance.serving.midx import installed_stems, write_midx

    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    work = tmp_path / "w"
    git("init", "-q", "-b", "main", str(work))
    for i in range(2):
        (work / "f").write_text(f"{i}\n")
        git("add", "f", cwd=work)
        git("commit", "-q", "-m", f"c{i}", cwd=work)
        objs = git("rev-list", "--objects", "HEAD", "--not", "HEAD~1" if i else "--", cwd=work)
        git("pack-objects", "-q", str(bare / "objects" / "pack" / "pack"), cwd=work, input=objs)
    pack_dir = bare / "objects" / "pack"
    assert plan_maintenance(gather_stats(bare, now=NOW, history=RECENT_FULL), POLICY, NOW).reasons[0].startswith(
        "multi-pack-index missing over 2 packs")
    write_midx(pack_dir, installed_stems(pack_dir))
    s = gather_stats(bare, now=NOW)
    assert s.midx is not None and not s.midx.wanted and s.as_dict()["midx_present"] is True


# -- object pools (planning/poolstats.py) ----------------------------------------------------------

def _pool(behind: int | None, members: int = 3) -> PoolStats:
    return PoolStats(PoolRole.POOL, members=members, source="/srv/src.git", source_refs=10,
                     source_refs_behind=behind, pool_pack_bytes=100 * MIB, own_pack_bytes=MIB, members_listed=members)


@pytest.mark.parametrize("case,pool,packs,loose,history,action,deferred_fetch", [
    ("a pool the source has not moved past", _pool(0), progression(3), 0, RECENT_FULL, Action.NOTHING, False),
    ("a source ref at an object the pool lacks", _pool(1), progression(3), 0, RECENT_FULL, Action.POOL_FETCH, False),
    ("the source was not read (outside the roots)", _pool(None), progression(3), 0, RECENT_FULL, Action.NOTHING,
     False),
    ("fetch first: the loose repack waits", _pool(2), progression(3), 2048, RECENT_FULL, Action.POOL_FETCH, False),
    ("a full repack due runs first; the fetch waits", _pool(2), smalls(60), 0, RepackHistory(), Action.FULL, True),
    ("a member is planned as any repository", PoolStats(PoolRole.MEMBER, pool="/srv/pool.git"), progression(3), 0,
     RECENT_FULL, Action.NOTHING, False),
])
def test_pool_plans(case, pool, packs, loose, history, action, deferred_fetch):
    plan = plan_maintenance(stats(packs, loose=loose, history=history, pool=pool), POLICY, NOW)
    assert plan.action is action, (case, plan)
    fetch_reason = [r for r in (*plan.reasons, *plan.deferred) if "a fetch brings them" in r]
    assert bool(fetch_reason) == (action is Action.POOL_FETCH or deferred_fetch), (case, plan)
    assert (fetch_reason[0] in plan.deferred) == deferred_fetch if fetch_reason else True
    if action is Action.POOL_FETCH and loose:
        assert any("loose objects" in r for r in plan.deferred)   # the repack it displaced is said, not lost


@pytest.mark.parametrize("pool,ratio", [
    (PoolStats(PoolRole.POOL, members=20, pool_pack_bytes=60 * MIB, own_pack_bytes=0, members_listed=20), 20.0),
    (PoolStats(PoolRole.POOL, members=2, pool_pack_bytes=MIB, own_pack_bytes=MIB, members_listed=2), 1.5),
    (PoolStats(PoolRole.POOL, members=0, pool_pack_bytes=MIB), None),
    (PoolStats(PoolRole.MEMBER, pool_pack_bytes=MIB, own_pack_bytes=MIB), None),
])
def test_dedupe_ratio_is_full_copies_over_shared(pool, ratio):
    assert pool.dedupe_ratio == ratio
