"""packyard submit <task> --repo R: queue a job by task name, as a hosting frontend would."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from packyard.workers.cli.args import add_repo_arg
from packyard.workers.cli.prepare import prepare_embedded
from packyard.workers.cli.tasknames import known_tasks, normalize_task_name
from packyard.workers.settings import get_settings


class TaskHelp(argparse.Action):
    """``-h/--help``: the command's help and, after ``submit TASK``, the task's parameters (:func:`task_help`)."""

    def __init__(self, option_strings, dest, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        parser.print_help()
        task = getattr(namespace, "task", None)
        if task:
            print()
            try:
                print(task_help(task))
            except KeyError:
                known = ", ".join(k.removeprefix("packyard.") for k in known_tasks())
                print(f"unknown task {task!r}; known: {known}")
        parser.exit()


def task_help(task: str) -> str:
    """The parameters of a task, from its signature: name, type, default (as -p takes it: JSON), in order.

    Raises KeyError for a task that is not packyard's.
    """
    import inspect

    from packyard.workers.app import app
    from packyard.workers.tasks.boundary import declared_inputs

    name = normalize_task_name(task)
    if name not in known_tasks():
        raise KeyError(name)
    t = app.tasks[name]
    inputs = declared_inputs(t)
    doc = " ".join((inspect.getdoc(t.run) or "").split("\n\n", 1)[0].split())
    lines = [f"{name}: {doc}" if doc else name,
             "parameters (-p KEY=VALUE, VALUE parsed as JSON when it is JSON; repo is --repo):"]
    params = list(inspect.signature(t.run).parameters.values())
    width = max((len(f"{p.name}: {p.annotation}") for p in params), default=0)
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        typed = f"{p.name}: {p.annotation}" if p.annotation is not p.empty else p.name
        if p.default is p.empty:
            what = "required" + (" (--repo)" if p.name == "repo" else "")
        else:
            what = f"default {json.dumps(p.default, default=str)}"
        if p.name in inputs:
            from packyard.workers.confine import InputKind

            kind = inputs[p.name]
            what += f"; {kind.value}" + ("" if kind is InputKind.REPOSITORY else " in PACKYARD_INCOMING_DIR")
        lines.append(f"  {typed.ljust(width)}  {what}")
    return "\n".join(lines)


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "submit", help="queue a job (by task name)", add_help=False,
        description="Publish a task by name (app.send_task, like a frontend). The queued job row is recorded. "
                    "Task names: verify_repo (or verify-repo, packyard.verify_repo), … The repository must lie "
                    "in a storage root (PACKYARD_STORAGE_ROOTS; --repo PATH or --repo STORAGE:RELATIVE/PATH) and "
                    "input files (-p pack=, source=, objects_file=) in PACKYARD_INCOMING_DIR (a relative name is "
                    "relative to it); what this process can check is checked before sending.")
    p.add_argument("-h", "--help", action=TaskHelp,
                   help="show this help; `packyard submit TASK --help` also lists TASK's parameters")
    p.add_argument("task", help="task name, e.g. verify_repo")
    add_repo_arg(p)
    p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                   help="extra task parameter (VALUE parsed as JSON when it is JSON, else a string)")
    p.add_argument("--no-check", action="store_true",
                   help="skip the client-side check of argument types and paths (the worker checks regardless)")
    p.add_argument("--wait", action="store_true", help="wait for the result and print it")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait with --wait (default 600)")
    p.set_defaults(func=run)


def parse_params(items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"packyard submit: bad parameter {item!r} (want KEY=VALUE)")
        try:
            params[key] = json.loads(raw)
        except ValueError:
            params[key] = raw
    return params


def run(args: argparse.Namespace) -> int:
    name = normalize_task_name(args.task)
    known = known_tasks()
    if name not in known:
        print(f"packyard submit: unknown task {args.task!r}; known: "
              f"{', '.join(k.removeprefix('packyard.') for k in known)}", file=sys.stderr)
        return 2
    s = get_settings()
    from packyard.store.errors import InvalidInputError, LimitExceededError
    from packyard.workers.app import app
    from packyard.workers.broker import check_message_size
    from packyard.workers.confine import Confinement
    from packyard.workers.tasks.boundary import check_call

    repo = args.repo
    if not Confinement.from_settings(s).names_storage(repo):
        repo = str(Path(repo).expanduser().resolve())
    kwargs = {"repo": repo, **parse_params(args.param)}
    if not args.no_check:
        try:  # the same checks the worker makes (it makes them regardless): fail here, before queueing
            kwargs = check_call(app.tasks[name], (), kwargs, s)
        except InvalidInputError as err:
            print(f"packyard submit: {type(err).__name__}: {err}", file=sys.stderr)
            return 2
    try:  # not skipped by --no-check: the broker refuses it anyway (it closes the connection mid-message)
        check_message_size(s, name, (), kwargs)
    except LimitExceededError as err:
        print(f"packyard submit: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    prepare_embedded(s)
    result = app.send_task(name, kwargs=kwargs)
    print(f"queued {name} {result.id} repo={kwargs['repo']}", flush=True)
    if not args.wait:
        return 0
    return wait_and_print(s, result, args.timeout)


def wait_and_print(s, result, timeout: float) -> int:  # type: ignore[no-untyped-def]
    from celery.exceptions import TimeoutError as CeleryTimeout

    try:
        value = result.get(timeout=timeout, propagate=False)
    except CeleryTimeout:
        print(f"{result.id}: still {result.state} after {timeout}s", file=sys.stderr)
        return 3
    job = job_row(s, result.id)
    if result.successful():
        print(json.dumps({"task_id": result.id, "state": result.state, "result": value,
                          "duration_ms": job.duration_ms if job else None}, indent=2, default=str))
        return 0
    print(json.dumps({"task_id": result.id, "state": result.state,
                      "error": job.error if job and job.error else str(value)}, indent=2, default=str))
    return 1


def job_row(s, task_id: str):  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from packyard.workers.records import Job, session_scope

    with session_scope(s) as session:
        return session.scalar(select(Job).where(Job.task_id == task_id))
