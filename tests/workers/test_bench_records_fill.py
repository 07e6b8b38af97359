"""The records benchmark's fill (workers/cli/bench/recordsfill.py, fill_database): the big tables' rows are loaded
before their secondary indexes (and, on PostgreSQL, foreign keys), which are then built from the migrated
database's own definitions; the filled database has exactly the indexes and keys of a fresh ``alembic upgrade
head``, and a fill that ends otherwise fails.

Real SQLite and PostgreSQL (PACKYARD_TEST_POSTGRES_URL; skipped without it); a few thousand rows.
"""
from __future__ import annotations

import pytest
from sqlalchemy import inspect, text


@pytest.fixture
def url(records_url):  # type: ignore[no-untyped-def]
    return records_url


def schema_indexes(url):
    """Every index, unique constraint and foreign key of every table, as SQLAlchemy's inspector reflects them."""
    from packyard.workers.records import get_engine

    with get_engine(url).connect() as c:
        insp = inspect(c)
        out = {}
        for table in sorted(insp.get_table_names()):
            out[table] = (
                sorted((ix["name"], tuple(ix["column_names"]), bool(ix["unique"])) for ix in insp.get_indexes(table)),
                sorted((uq["name"], tuple(uq["column_names"])) for uq in insp.get_unique_constraints(table)),
                sorted((fk["name"], tuple(fk["constrained_columns"]), fk["referred_table"],
                        tuple(fk["referred_columns"]), str(sorted(fk["options"].items())))
                       for fk in insp.get_foreign_keys(table)),
            )
        return out


def fill(url, jobs=3000):
    from packyard.workers.cli.bench import recordsfill as bench
    from packyard.workers.records import get_engine, utcnow

    phases = bench.Phases("test fill")
    bench.fill_database(get_engine(url), bench.Fill(jobs, 40, 40.0, utcnow(), 5), jobs, phases)
    return phases.done


def test_the_filled_database_has_the_indexes_of_a_fresh_upgrade(url):
    from packyard.workers.cli.bench import recordsfill as bench
    from packyard.workers.records import get_engine

    fresh = schema_indexes(url)   # the database is at head and empty: what `alembic upgrade head` made
    deferred = bench.deferred_schema(get_engine(url))
    assert {d.table for d in deferred} == set(bench.BIG_TABLES)
    assert {"ix_jobs_state_kind", "ix_jobs_finished_at_id", "ix_lock_events_at"} <= {d.name for d in deferred}
    done = fill(url)
    assert schema_indexes(url) == fresh
    names = [p["phase"] for p in done]
    assert names.index("rows: jobs, lock events, race events") < min(
        i for i, n in enumerate(names) if n.endswith(" on jobs"))       # rows first, indexes after
    assert sum(1 for n in names if n.startswith(("index ", "unique ", "foreign key "))) == len(deferred)
    with get_engine(url).connect() as c:
        assert c.execute(text("SELECT count(*) FROM jobs")).scalar() == 3000
        assert c.execute(text("SELECT count(*) FROM lock_events")).scalar() == 6000
    if url.startswith("postgresql"):   # the unique constraint came back as a constraint, the keys as keys
        kinds = {d.name: d.kind for d in deferred}
        assert kinds["uq_jobs_task_id"] == "unique" and kinds["fk_jobs_repo_id_repositories"] == "foreign key"
        assert sum(1 for k in kinds.values() if k == "foreign key") == 3
        with get_engine(url).connect() as c:
            assert c.execute(text("SELECT count(*) FROM pg_stats WHERE tablename = 'jobs'")).scalar() > 0   # ANALYZE


def test_a_fill_that_ends_with_other_indexes_fails_loudly(url):
    from packyard.workers.cli.bench import recordsfill as bench
    from packyard.workers.records import get_engine

    engine = get_engine(url)
    want = bench.deferred_schema(engine)
    fill(url, jobs=500)
    with engine.begin() as c:
        c.execute(text("DROP INDEX ix_jobs_kind"))
    with pytest.raises(bench.SchemaMismatch, match="missing \\['ix_jobs_kind'\\]"):
        bench.check_schema(engine, want)
    with engine.begin() as c:   # the same name on other columns: not the migrations' index either
        c.execute(text("CREATE INDEX ix_jobs_kind ON jobs (kind, id)"))
    with pytest.raises(bench.SchemaMismatch, match="ix_jobs_kind"):
        bench.check_schema(engine, want)
    with engine.begin() as c:
        c.execute(text("DROP INDEX ix_jobs_kind"))
        c.execute(text("CREATE INDEX ix_jobs_kind ON jobs (kind)"))
    bench.check_schema(engine, want)
    if url.startswith("postgresql"):   # a foreign key left out is caught too
        with engine.begin() as c:
            c.execute(text("ALTER TABLE race_events DROP CONSTRAINT fk_race_events_repo_id_repositories"))
        with pytest.raises(bench.SchemaMismatch, match="fk_race_events_repo_id_repositories"):
            bench.check_schema(engine, want)
