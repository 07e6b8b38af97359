"""Should we repack, how, and why: a pure function from statistics to a plan.

``plan_maintenance(stats, policy, now)`` reads no file and asks no service; the same
statistics always give the same plan, and every plan says why in words. The thresholds
are git's and Gitaly's (the defaults of :class:`MaintenancePolicy`):

=====================================  ==========================================================
rule                                    source
=====================================  ==========================================================
loose objects >= 1,024 → ``loose``      Gitaly's loose-object limit (git's gc.auto is 6,700)
packs outside the geometric             Gitaly: max(2, log(total MiB) / log(1.8)) packs may sit
progression > the allowance →           outside the progression; the progression is git's
``geometric``                           ``repack --geometric=2`` split
more than 50 repackable packs           git's gc.autoPackLimit
a full repack at most every 5 days      Gitaly's full-repack cooldown; warranted only by
                                        something a full repack fixes: too many packs, packs
                                        outside the progression, cruft past its expiry, or no
                                        reachability bitmap / one not matching its pack (git's
                                        repack -adb writes one; Gitaly repacks fully without one)
multi-pack-index missing (2+ packs,    git repack --geometric --write-midx / Gitaly's geometric
not .keep/cruft) or stale (names packs  repack leave one over the packs that stay; a geometric
that are gone, misses packs) →          repack with nothing to roll up only (re)writes it
``geometric``
leftovers → ``gc``                      stale temp files, abandoned quarantines, preserved packs
                                        past their delay
commit-graph missing, without GDA2 or   Gitaly writes the graph after every repack; a repack planned
Bloom filters, or not covering the      anyway says so too, otherwise a ``loose`` repack is planned
branch tips                             (it writes the graph and packs refs even with no loose object)
loose refs > max(16, ln(packed-refs     Gitaly's pack-refs threshold
bytes / 100) / ln 1.15)
=====================================  ==========================================================

One action per plan, in the order full > geometric > loose > gc; what was also due but
not chosen is listed in ``deferred`` (it is planned again on the next run).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Any

from .poolstats import PoolRole
from .servingstats import serving_reasons
from .stats import RepoStats

DAY = 86400.0


class Action(str, enum.Enum):
    NOTHING = "nothing"
    LOOSE = "loose"          # pack the loose objects (git repack -d)
    GEOMETRIC = "geometric"  # merge the small packs (git repack --geometric=2 -d)
    FULL = "full"            # everything reachable into one pack, unreachable into a cruft pack
    GC = "gc"                # remove leftovers only
    POOL_FETCH = "pool_fetch"  # an object pool: bring its source's new objects and refs in (packyard pool fetch)

    @property
    def is_repack(self) -> bool:
        return self in (Action.LOOSE, Action.GEOMETRIC, Action.FULL)


@dataclass(frozen=True)
class MaintenancePolicy:
    """The thresholds (Settings builds one from PACKYARD_MAINTENANCE_* variables)."""

    loose_objects_limit: int = 1024
    pack_limit: int = 50
    full_repack_interval: float = 5 * DAY
    geometric_factor: int = 2
    geometric_log_base: float = 1.8
    min_packs_outside: float = 2.0
    cruft_expire: float = 14 * DAY
    preserve_for: float = 3600.0
    commit_graph: bool = True        # plan for a commit-graph (a repack writes one unless told not to)
    pack_refs: bool = True           # plan for packed refs (Gitaly's loose-ref threshold)


@dataclass(frozen=True)
class MaintenancePlan:
    action: Action
    reasons: tuple[str, ...]
    params: tuple[tuple[str, Any], ...] = ()     # what the job needs (mode, factor, expire, ...)
    deferred: tuple[str, ...] = ()               # also due, waits for the next run

    @property
    def needs_job(self) -> bool:
        return self.action is not Action.NOTHING

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action.value, "reasons": list(self.reasons), "params": dict(self.params),
                "deferred": list(self.deferred)}


@dataclass(frozen=True)
class _Findings:
    """Everything the rules look at, computed once."""

    loose: int
    packs: int
    outside: int
    allowed_outside: float
    total_mib: float
    since_full: float | None
    full_allowed: bool
    expirable_cruft: int
    leftovers: tuple[str, ...] = field(default_factory=tuple)
    bitmap: str | None = None    # why the bitmap calls for a full repack (None: it does not)
    midx: str | None = None      # why the multi-pack-index needs (re)writing, None if it does not


def allowed_outside(total_bytes: int, policy: MaintenancePolicy = MaintenancePolicy()) -> float:
    """How many packs may sit outside the geometric progression: max(2, log(total MiB) / log(1.8))."""
    mib = total_bytes / (1 << 20)
    if mib <= 1.0:
        return policy.min_packs_outside
    return max(policy.min_packs_outside, math.log(mib) / math.log(policy.geometric_log_base))


def _age(seconds: float) -> str:
    if seconds >= 2 * DAY:
        return f"{seconds / DAY:.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} hours"
    if seconds >= 120:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds:.0f} seconds"


def _findings(stats: RepoStats, policy: MaintenancePolicy, now: float) -> _Findings:
    repackable = stats.repackable_packs
    last_full = stats.history.last_full_repack_at
    since_full = None if last_full is None else max(0.0, now - last_full)
    expirable = sum(1 for p in stats.packs
                    if p.cruft and p.cruft_oldest is not None and now - p.cruft_oldest >= policy.cruft_expire)
    leftovers = []
    if stats.stale_tmp_objects:
        leftovers.append(f"{stats.stale_tmp_objects} stale tmp_obj_* file(s) of dead writers in the sampled "
                         f"fan-out directories")
    if stats.stale_pack_temps:
        leftovers.append(f"{stats.stale_pack_temps} objects/pack/tmp_* file(s) of dead writers or past git's "
                         f"prune expiry")
    if stats.stale_quarantines:
        leftovers.append(f"{stats.stale_quarantines} abandoned incoming-* quarantine(s)")
    expired_preserved = sum(1 for at in stats.preserved_at if now - at >= policy.preserve_for)
    if expired_preserved:
        leftovers.append(f"{expired_preserved} preserved pack(s) past their {_age(policy.preserve_for)} delay")
    return _Findings(
        bitmap=_bitmap_problem(repackable),
        loose=stats.loose_estimate, packs=len(repackable),
        outside=stats.packs_outside_progression(policy.geometric_factor),
        allowed_outside=allowed_outside(sum(p.pack_bytes for p in repackable), policy),
        total_mib=sum(p.pack_bytes for p in repackable) / (1 << 20),
        since_full=since_full,
        full_allowed=since_full is None or since_full >= policy.full_repack_interval,
        expirable_cruft=expirable, leftovers=tuple(leftovers),
        midx=_midx_problem(stats, len(repackable)))


def _midx_problem(stats: RepoStats, repackable: int) -> str | None:
    """A stale multi-pack-index, or none over 2+ repackable packs (.keep and cruft packs do not count: a full
    repack's pack and its cruft pack, or a .keep pack beside one push, are no reason for a job)."""
    m = stats.midx
    if m is None:
        return None
    if m.stale:
        return m.reason()
    if not m.present and repackable >= 2:
        return f"multi-pack-index missing over {repackable} packs"
    return None


def _bitmap_problem(packs) -> str | None:
    """A bitmap that does not match its pack, or none among packs whose bitmap was looked at."""
    looked = [p for p in packs if p.bitmap is not None]
    for p in looked:
        if p.bitmap not in ("ok", "missing"):
            return f"{p.name}.bitmap does not match its pack ({p.bitmap})"
    if looked and not any(p.bitmap == "ok" for p in looked):
        return (f"no reachability bitmap for any of {len(looked)} pack(s) (a clone counts every object without "
                f"one)")
    return None


def plan_maintenance(stats: RepoStats, policy: MaintenancePolicy, now: float) -> MaintenancePlan:
    """The plan for a repository with these statistics at ``now`` (epoch seconds)."""
    return _with_pool(_with_serving(_plan_packs(stats, policy, now), stats, policy), stats)


def _with_pool(plan: MaintenancePlan, stats: RepoStats) -> MaintenancePlan:
    """An object pool whose source has refs at commits the pool holds under no ref gets a fetch first (the
    members' repacks can then drop those objects, as Gitaly fetches into a pool before it optimizes it), unless
    a full repack is due: that runs first (at most every full_repack_interval) and the fetch waits a night."""
    p = stats.pool
    if p.role is not PoolRole.POOL or not p.source_refs_behind:
        return plan
    fetch = (f"{p.source_refs_behind} of the source's {p.source_refs} refs point at objects the pool keeps under "
             f"no ref (a fetch brings them, so the {p.members} member(s)' repacks can drop their copies)")
    if plan.action is Action.FULL:
        return replace(plan, deferred=plan.deferred + (fetch,))
    deferred = (plan.reasons if plan.needs_job else ()) + plan.deferred
    return MaintenancePlan(Action.POOL_FETCH, (fetch,), (), tuple(deferred))


def _with_serving(plan: MaintenancePlan, stats: RepoStats, policy: MaintenancePolicy) -> MaintenancePlan:
    """Add the commit-graph and pack-refs reasons: every repack writes both (unless the policy says not);
    when no repack is due but they are, a ``loose`` repack is planned for them."""
    graph, refs = serving_reasons(stats.serving, commit_graph=policy.commit_graph, pack_refs=policy.pack_refs)
    due = graph + refs
    if plan.action.is_repack:   # the job is told what the policy turned off (a repack writes both by default)
        off = tuple((k, False) for k, on in (("commit_graph", policy.commit_graph), ("pack_refs", policy.pack_refs))
                    if not on)
        plan = replace(plan, params=plan.params + off)
    if not due:
        return plan
    if plan.action.is_repack:
        return replace(plan, reasons=plan.reasons + tuple(f"also: {r}" for r in due))
    deferred = plan.reasons if plan.action is Action.GC else ()
    return MaintenancePlan(Action.LOOSE, tuple(due), (("mode", "loose"),), tuple(deferred) + plan.deferred)


def _plan_packs(stats: RepoStats, policy: MaintenancePolicy, now: float) -> MaintenancePlan:
    """The pack and loose-object part of the plan."""
    f = _findings(stats, policy, now)
    loose_due = f.loose >= policy.loose_objects_limit
    geometric_due = f.outside > f.allowed_outside
    too_many = f.packs > policy.pack_limit

    loose_reason = (f"~{f.loose:,} loose objects (estimated from {stats.loose_sampled:,} in "
                    f"{stats.loose_sample_dirs} of 256 fan-out directories) >= {policy.loose_objects_limit:,}")
    geometric_reason = (f"{f.outside} of {f.packs} packs outside the geometric progression (factor "
                        f"{policy.geometric_factor}) > {f.allowed_outside:.1f} allowed for {f.total_mib:.1f} MiB "
                        f"(max(2, log(MiB)/log({policy.geometric_log_base:g})))")
    too_many_reason = f"{f.packs} packs > gc.autoPackLimit {policy.pack_limit}"
    cruft_reason = (f"{f.expirable_cruft} cruft pack(s) hold objects unreachable for more than "
                    f"{_age(policy.cruft_expire)} (expire them)")
    if f.since_full is None:
        full_when = "no full repack on record"
    else:
        full_when = f"last full repack {_age(f.since_full)} ago"

    deferred: list[str] = []
    if f.full_allowed and (too_many or geometric_due or f.expirable_cruft or f.bitmap):
        reasons = [r for r, on in ((too_many_reason, too_many), (geometric_reason, geometric_due),
                                   (cruft_reason, f.expirable_cruft), (f.bitmap or "", f.bitmap)) if on]
        reasons.append(f"{full_when} (at most every {_age(policy.full_repack_interval)})")
        if loose_due:
            reasons.append(loose_reason + " (packed by the full repack too)")
        deferred += f.leftovers
        return MaintenancePlan(Action.FULL, tuple(reasons),
                               (("mode", "full"), ("expire", int(policy.cruft_expire))), tuple(deferred))
    cooldown = (f"a full repack is not due: {full_when}, at most every {_age(policy.full_repack_interval)}")
    if geometric_due or (too_many and f.outside >= 2):
        reasons = [r for r, on in ((geometric_reason, geometric_due), (too_many_reason, too_many)) if on]
        if too_many or f.expirable_cruft:
            reasons.append(cooldown)
        if loose_due:
            deferred.append(loose_reason)
        deferred += f.leftovers
        return MaintenancePlan(Action.GEOMETRIC, tuple(reasons),
                               (("mode", "geometric"), ("factor", policy.geometric_factor)), tuple(deferred))
    if loose_due:
        reasons = [loose_reason] + ([f.midx + " (the loose repack writes one)"] if f.midx else [])
        return MaintenancePlan(Action.LOOSE, tuple(reasons), (("mode", "loose"),), tuple(f.leftovers))
    if f.midx:
        return MaintenancePlan(Action.GEOMETRIC, (f.midx,),
                               (("mode", "geometric"), ("factor", policy.geometric_factor)), tuple(f.leftovers))
    if f.leftovers:
        return MaintenancePlan(Action.GC, f.leftovers, (("preserve_for", int(policy.preserve_for)),))
    reasons = [f"~{f.loose:,} loose objects < {policy.loose_objects_limit:,}",
               f"{f.outside} of {f.packs} packs outside the geometric progression <= "
               f"{f.allowed_outside:.1f} allowed",
               too_many_reason + ", but they form a geometric progression" if too_many
               else f"{f.packs} packs <= gc.autoPackLimit {policy.pack_limit}"]
    if f.expirable_cruft or too_many or f.bitmap:
        reasons.append(cooldown)
        if f.bitmap:
            reasons.append(f.bitmap)
    elif f.full_allowed:
        reasons.append(f"{full_when}, but nothing a full repack would fix")
    else:
        reasons.append(full_when)
    return MaintenancePlan(Action.NOTHING, tuple(reasons))
