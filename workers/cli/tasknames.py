"""Task names as the CLI takes them (``verify-repo``) and the ones the Celery app registers."""
from __future__ import annotations


def normalize_task_name(name: str) -> str:
    """``verify-repo`` / ``verify_repo`` / ``packyard.verify_repo`` → ``packyard.verify_repo``."""
    base = name.removeprefix("packyard.").replace("-", "_")
    return f"packyard.{base}"


def known_tasks() -> list[str]:
    import packyard.workers.tasks  # noqa: F401  (registers every task module)
    from packyard.workers.app import app

    return sorted(n for n in app.tasks if n.startswith("packyard."))
