"""Only packyard's tasks run in a packyard worker: every other registered name is refused and recorded.

Celery registers its built-in tasks in every app (``celery.starmap``, ``celery.map``, ``celery.chunks``,
``celery.chain``, ``celery.group``, ``celery.chord``, ``celery.chord_unlock``, ``celery.accumulate``,
``celery.backend_cleanup``). Some call a task's function inside the worker with arguments from the
message (``celery.starmap``: ``task(*args)`` for each item), which would run a packyard task's body
without its boundary (storage roots, incoming dir, safety rules) and without a job row. packyard uses
none of them (no canvas, a result backend that expires its own keys), so once the app is finalized
each name that is not ``packyard.*`` is replaced by :class:`ForeignTask`, which runs nothing: the
delivery fails with an InvalidInputError saying why, and a job row of kind ``celery.<name>`` records
the refusal (``packyard status`` shows it). Flower's send-task/apply API and ``app.send_task`` reach the
worker as messages and meet the same refusal; ``packyard submit`` knows only ``packyard.*`` names.
"""
from __future__ import annotations

from typing import Any

from celery import Celery, Task

from packyard.store.errors import InvalidInputError

#: Names a packyard worker runs; anything else is refused.
TASK_PREFIX = "packyard."


class ForeignTask(Task):
    """A registered name that is not a packyard task: refuses every delivery (and records it)."""

    abstract = True
    acks_late = False
    typing = False      # any arguments: the refusal must not depend on them

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refusal()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from packyard.workers.records import task_runs

        err = self._refusal()
        req = self.request
        if req.id is not None:
            task_runs.job_refused(req.id, self.name, args, kwargs, req.hostname, err)
        raise err

    def _refusal(self) -> InvalidInputError:
        return InvalidInputError(f"{self.name} is not a packyard task: a packyard worker runs only {TASK_PREFIX}* "
                                 "tasks, each through its own recorded and confined message; refused, nothing ran")


def refuse_foreign_tasks(app: Celery) -> list[str]:
    """Replace every registered task whose name is not ``packyard.*`` by a refusing :class:`ForeignTask`."""
    replaced = []
    for name in sorted(n for n in list(app.tasks) if not n.startswith(TASK_PREFIX)):
        if isinstance(app.tasks[name], ForeignTask):
            continue
        task = type("Refused_" + name.replace(".", "_"), (ForeignTask,),
                    {"name": name, "__module__": __name__, "abstract": False})()
        app.tasks[name] = task
        task.bind(app)
        replaced.append(name)
    return replaced
