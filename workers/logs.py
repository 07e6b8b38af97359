"""structlog, configured once per process for packyard's own and every stdlib logger (Celery's included).

JSON lines when stderr is not a terminal (or ``PACKYARD_LOG_FORMAT=json``),
a readable console renderer on one. Job context (``job_id``, ``task``, ``repo``)
is bound with :func:`bind_job` into contextvars, so every line a job logs carries it,
including Celery's own lines about that task.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

_configured: tuple[str, str] | None = None


def _wants_json(fmt: str, stream: TextIO) -> bool:
    if fmt == "json":
        return True
    if fmt == "console":
        return False
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return True


def configure(fmt: str = "auto", level: str = "INFO", stream: TextIO | None = None, force: bool = False) -> None:
    """Configure structlog and the stdlib root logger once; later calls are no-ops unless ``force``."""
    global _configured
    stream = stream or sys.stderr
    if _configured is not None and not force:
        return
    as_json = _wants_json(fmt, stream)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: Any
    if as_json:
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=getattr(stream, "isatty", lambda: False)())
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *shared,
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
    for noisy in ("sqlalchemy.engine", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    _configured = ("json" if as_json else "console", level)


def configure_from_settings(settings: Any, force: bool = False) -> None:
    configure(settings.log_format, settings.log_level, force=force)


def get_logger(name: str = "packyard") -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)


def bind_job(**values: Any) -> None:
    """Bind job context (job_id, task, repo, …) to every following log line of this job."""
    structlog.contextvars.bind_contextvars(**{k: v for k, v in values.items() if v is not None})


def clear_job() -> None:
    structlog.contextvars.clear_contextvars()
