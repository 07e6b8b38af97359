"""Job records: models, engine/sessions, migrations entry point and the recorders.

``task_runs`` is the task side (Celery signals and the task base class turn runs into job rows),
``recorder`` writes the rows, ``registry`` the repositories, ``aggregates`` the counters, ``retention`` prunes,
``jobrows`` reads the newest rows without SQLAlchemy (``packyard status``).

    from packyard.workers.records import upgrade_database, session_scope, Job, JobState

The names below are loaded on first use (module ``__getattr__``): importing a submodule such as ``jobrows``
does not import SQLAlchemy's engine and ORM (issue 39).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: name -> the submodule defining it
_EXPORTS = {
    **dict.fromkeys(("downgrade_database", "get_engine", "session_scope", "upgrade_database"), "db"),
    **dict.fromkeys(("Base", "Job", "JobState", "LockEvent", "LockEventKind", "RaceEvent", "Repository", "utcnow"),
                    "models"),
}

__all__ = ["Base", "Job", "JobState", "LockEvent", "LockEventKind", "RaceEvent", "Repository",
           "downgrade_database", "get_engine", "session_scope", "upgrade_database", "utcnow"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from packyard.workers.records.db import downgrade_database, get_engine, session_scope, upgrade_database
    from packyard.workers.records.models import (
        Base,
        Job,
        JobState,
        LockEvent,
        LockEventKind,
        RaceEvent,
        Repository,
        utcnow,
    )
