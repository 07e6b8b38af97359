"""SQLAlchemy 2.0 typed models of the job records.

``repositories`` — every repository packyard has worked on, and the maintenance registry
(enabled, ingests since the last repack, last repacks, the last plan); ``jobs`` — one row per
job (task id): queued → started → success/failure, counters, error; every delivery of
its message is counted (``attempts``, first and last start), so a redelivery shows, and a
job whose message vanished is marked ``LOST`` by the reconciler; ``lock_events`` —
every acquire/renew/release/loss of a repository lease with its fencing token;
``race_events`` — races the workers and the race harness's readers observed (a lookup
recovered by re-listing objects/pack or from ``preserved/``, a quick check answered
"absent", a lost read), one row per miss (``packyard races``).

The migrations in ``migrations/versions/`` spell the same tables out statically;
``tests/workers/test_migrations.py`` checks that they agree.
"""
from __future__ import annotations

import enum
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class JobState(str, enum.Enum):
    QUEUED = "QUEUED"
    STARTED = "STARTED"
    RETRY = "RETRY"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    #: No broker queue holds its message and no worker runs it (the reconciler's verdict, with the
    #: reason in ``error``). Not an outcome: a LOST job that later starts or finishes is overwritten.
    LOST = "LOST"

    @property
    def finished(self) -> bool:
        """The job has its outcome: a later delivery of it is acknowledged without running."""
        return self in FINISHED_STATES

    @property
    def pending(self) -> bool:
        """Queued, running or waiting for a retry: the reconciler looks for its message."""
        return self in PENDING_STATES


#: The states that are a job's outcome (the first one recorded stands) and the live ones (queued, running,
#: waiting for a retry): the one definition the recorder, the registry, the planner and the reconciler use.
FINISHED_STATES = (JobState.SUCCESS, JobState.FAILURE)
PENDING_STATES = (JobState.QUEUED, JobState.STARTED, JobState.RETRY)


def normalize_repo_path(path: str | Path) -> str:
    """The spelling of ``repositories.path``: expanded and resolved (the one definition; the registry calls it
    ``normalize``)."""
    return str(Path(path).expanduser().resolve())


class LockEventKind(str, enum.Enum):
    ACQUIRED = "acquired"
    RENEWED = "renewed"
    RELEASED = "released"
    LOST = "lost"        # another holder owns the lease now
    EXPIRED = "expired"  # the lease ran out and nobody holds it
    BROKEN = "broken"    # deleted by a waiter because its holder process was provably dead (job = the dead holder's)
    # Migration 0004 (issue 11: maintenance exclusivity):
    TAKEN_OVER = "taken_over"      # acquired after the previous holder's lease ran out (or was broken) unreleased
    SKIPPED = "skipped"            # a scheduled job found the lease taken and did not run (detail: the holder)
    ABORTED = "aborted"            # a holder stopped before a destructive step: lease lost or fence refused it
    WAIT_TIMEOUT = "wait_timeout"  # waited ``waited_ms`` for the lease and gave up (the job is retried later)


class LeaseOutcome(str, enum.Enum):
    """What a job's lease did that an operator should see on its row (``jobs.lease``; None: nothing notable)."""

    WAITED = "waited"        # another job held the lease: this one waited (``lease_wait_ms``) and then ran
    SKIPPED = "skipped"      # a scheduled run found the lease taken and skipped (SUCCESS, counters skipped=1)
    TOOK_OVER = "took_over"  # the previous holder's lease ran out (or its process died) without a release
    LOST = "lost"            # the lease was lost while working: the job aborted before deleting and is retried
    BUSY = "busy"            # waited its bound for the lease and gave up (retried later)


def _enum(cls: type[enum.Enum], name: str) -> Enum:
    # Stored as plain strings (no native ENUM type): adding a value later is a no-op migration.
    return Enum(cls, name=name, native_enum=False, create_constraint=False, length=16,
                values_callable=lambda e: [m.value for m in e])


class Repository(Base):
    __tablename__ = "repositories"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(String(4096), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_verified_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_job_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The maintenance registry (migration 0003): the nightly run plans the enabled repositories;
    # the counters move as jobs land (recorder.record_finished).
    enabled: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    ingests_since_repack: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_repack_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_full_repack_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_planned_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_plan: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # action, reasons, stats, outcome
    # Migration 0005 (issue 21): the last plan's statistics as columns, so the exporter reads the top N and
    # the distributions with indexed queries (never the disk of every repository, never every plan's JSON);
    # ``due_action``: the action the last plan called for until a maintenance job of the repository lands.
    stats_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    stat_packs: Mapped[int | None] = mapped_column(Integer)
    stat_loose_objects: Mapped[int | None] = mapped_column(BigInteger)
    due_action: Mapped[str | None] = mapped_column(String(16))
    # Migration 0009 (issue 38): the newest good backup and the last failed one (registry.landed moves them).
    last_backup_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_backup_failed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    backup_entry: Mapped[str | None] = mapped_column(String(64))
    backup_checksum: Mapped[str | None] = mapped_column(String(64))

    # Each led by ``enabled``: the exporter's top N of the enabled repositories is one index walk, LIMIT rows long.
    __table_args__ = (
        # the planner's due list, a page at a time by keyset (migration 0006 added ``path``)
        Index("ix_repositories_enabled_last_planned_at_path", "enabled", "last_planned_at", "path"),
        Index("ix_repositories_enabled_stat_packs", "enabled", "stat_packs"),
        Index("ix_repositories_enabled_stat_loose_objects", "enabled", "stat_loose_objects"),
        Index("ix_repositories_enabled_last_full_repack_at", "enabled", "last_full_repack_at"),
        Index("ix_repositories_enabled_ingests_since_repack", "enabled", "ingests_since_repack"),
        Index("ix_repositories_enabled_due_action", "enabled", "due_action"),
        Index("ix_repositories_enabled_last_backup_at", "enabled", "last_backup_at"),
    )

    jobs: Mapped[list["Job"]] = relationship(back_populates="repository")


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(64), index=True)
    repo_id: Mapped[int | None] = mapped_column(ForeignKey("repositories.id", ondelete="SET NULL"))
    state: Mapped[JobState] = mapped_column(_enum(JobState, "job_state"))
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    queued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))   # the run that set the state
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    duration_ms: Mapped[int | None] = mapped_column(BigInteger)
    counters: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    error_type: Mapped[str | None] = mapped_column(String(128))
    retries: Mapped[int] = mapped_column(Integer, default=0)
    worker_hostname: Mapped[str | None] = mapped_column(String(255))
    worker_pid: Mapped[int | None] = mapped_column(Integer)
    # Deliveries of the job's message to a worker (each counted, also one acknowledged without running).
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    first_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Set by the reconciler when it finds the job pending but its message nowhere; cleared by any write.
    unseen_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Migration 0004: what the job's maintenance lease did (waited, skipped, took over, lost), and the wait.
    lease: Mapped[LeaseOutcome | None] = mapped_column(_enum(LeaseOutcome, "lease_outcome"))
    lease_wait_ms: Mapped[int | None] = mapped_column(BigInteger)

    repository: Mapped[Repository | None] = relationship(back_populates="jobs")

    # Migration 0005: one index per query the service runs (tests/workers/test_records_indexes.py reads EXPLAIN).
    __table_args__ = (
        Index("ix_jobs_repo_id_id", "repo_id", "id"),                # status --repo: newest first
        Index("ix_jobs_repo_id_kind_id", "repo_id", "kind", "id"),   # prune keeps each (repo, kind)'s newest
        Index("ix_jobs_state_kind", "state", "kind"),                # pending jobs (reconciler, in flight, scrape)
        Index("ix_jobs_finished_at_id", "finished_at", "id"),        # prune: oldest finished first
    )


class LockEvent(Base):
    __tablename__ = "lock_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int | None] = mapped_column(ForeignKey("repositories.id", ondelete="SET NULL"), index=True)
    job_id: Mapped[str | None] = mapped_column(String(64), index=True)  # the task id of the holder
    lock_name: Mapped[str] = mapped_column(String(255))
    event: Mapped[LockEventKind] = mapped_column(_enum(LockEventKind, "lock_event_kind"))
    fencing_token: Mapped[int | None] = mapped_column(BigInteger)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # Migration 0004: how long the acquirer waited; the holder it found or replaced, the step it aborted.
    waited_ms: Mapped[int | None] = mapped_column(BigInteger)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    __table_args__ = (Index("ix_lock_events_at", "at"),)   # migration 0005: prune by age


class RaceEvent(Base):
    __tablename__ = "race_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int | None] = mapped_column(ForeignKey("repositories.id", ondelete="SET NULL"), index=True)
    job_id: Mapped[str | None] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(64), index=True)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    observed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)


class Pool(Base):
    """An object pool (migration 0008): a repository whose objects its members borrow (store/maintenance/pool).
    The disk is the truth (the pool's ``packyard/members``, the members' alternates); these rows mirror it."""

    __tablename__ = "pools"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), unique=True)
    source_id: Mapped[int | None] = mapped_column(ForeignKey("repositories.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_fetched_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    fetches: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    repository: Mapped[Repository] = relationship(foreign_keys=[repo_id])
    source: Mapped[Repository | None] = relationship(foreign_keys=[source_id])
    members: Mapped[list["PoolMember"]] = relationship(back_populates="pool", cascade="all, delete-orphan",
                                                       passive_deletes=True)


class PoolMember(Base):
    """A repository that borrows from a pool (one pool at most), with its ref namespace key there."""

    __tablename__ = "pool_members"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pool_id: Mapped[int] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"), index=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), unique=True)
    key: Mapped[str] = mapped_column(String(64))
    linked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    pool: Mapped[Pool] = relationship(back_populates="members")
    repository: Mapped[Repository] = relationship()


# -- aggregates (migration 0005, issue 21) ---------------------------------------------------------------
#: Job duration histogram buckets, in seconds (a small write to a long full repack); ``b<i>`` counts the
#: durations in (bucket i-1, bucket i], the ones above the last bucket only count in ``timed``.
DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)
BUCKET_COLUMNS = tuple(f"b{i}" for i in range(len(DURATION_BUCKETS)))
#: What one aggregate row counts: events, events with a duration, their total, and the buckets.
COUNTED_COLUMNS = ("events", "timed", "duration_ms_sum", *BUCKET_COLUMNS)


class Family(str, enum.Enum):
    """Which events an aggregate row counts, and what its ``kind`` and ``state`` hold."""

    JOB = "job"      # a job that got its outcome (SUCCESS, FAILURE): kind = task name, state = outcome; in
                     # record_daily only, state LOST: the jobs the reconciler marked LOST that day (migration 0007)
    LOCK = "lock"    # a lock_events row: kind = lease (repo | maintenance), state = event
    RACE = "race"    # a race_events row: kind = its kind, state = ""
    #: A level, not events (record_totals only, never record_daily): ``events`` is how many job rows of ``kind``
    #: are in ``state`` now -- LOST (migration 0007). Moved in the same transaction as each row that enters
    #: (the reconciler's mark) or leaves it (a start, a finish, a re-queue, a retry, prune).
    LEVEL = "level"


def _counted_columns() -> list[Column[Any]]:
    return [Column(name, BigInteger, nullable=False, server_default=text("0")) for name in COUNTED_COLUMNS]


#: Counters since the records began: what a scrape reads (a few dozen rows, whatever the history).
record_totals = Table(
    "record_totals", Base.metadata,
    Column("family", String(8), primary_key=True),
    Column("kind", String(64), primary_key=True),
    Column("state", String(32), primary_key=True),
    *_counted_columns(),
)

#: The same counters per UTC day: the history that stays when prune deletes the rows it counted.
record_daily = Table(
    "record_daily", Base.metadata,
    Column("day", Date, primary_key=True),
    Column("family", String(8), primary_key=True),
    Column("kind", String(64), primary_key=True),
    Column("state", String(32), primary_key=True),
    *_counted_columns(),
)
