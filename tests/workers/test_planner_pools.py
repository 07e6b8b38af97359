"""The planner's pool fetch becomes a queued ``packyard.pool_fetch`` whose kwargs the task takes (no fleet run
needed: job_for is pure, the task's signature is the real one)."""
from __future__ import annotations

import inspect

import pytest

from packyard.store.maintenance.planning.strategy import Action, MaintenancePlan
from packyard.workers.commands.plan_maintenance import TASK_FOR_ACTION, job_for


def _task(name: str):
    import packyard.workers.tasks  # noqa: F401 (registers the tasks)
    from packyard.workers.app import app

    return app.tasks[name]


@pytest.mark.parametrize("action", [a for a in Action if a is not Action.NOTHING])
def test_every_action_a_plan_can_take_maps_to_a_registered_task_that_takes_its_kwargs(action):
    params = {Action.LOOSE: (("mode", "loose"),), Action.GEOMETRIC: (("mode", "geometric"), ("factor", 2)),
              Action.FULL: (("mode", "full"), ("expire", 1209600)), Action.GC: (("preserve_for", 3600),),
              Action.POOL_FETCH: ()}[action]
    name, kwargs = job_for(MaintenancePlan(action, ("why",), params), "/srv/r.git")
    assert name == TASK_FOR_ACTION[action]
    task = _task(name)
    inspect.signature(task.run).bind(**kwargs)      # raises TypeError on a kwarg the task does not take
    assert kwargs["repo"] == "/srv/r.git"


def test_a_pool_fetch_waits_for_the_pool_order_instead_of_skipping():
    name, kwargs = job_for(MaintenancePlan(Action.POOL_FETCH, ("behind",)), "/srv/pool.git")
    assert name == "packyard.pool_fetch" and kwargs == {"repo": "/srv/pool.git"}
