"""The edge between a broker message and a task body: argument checks, confinement, time limits.

``PackyardTask`` runs every delivery through :func:`prepared`, so no task re-implements any of it:

1. the message's arguments are bound to the task function's signature and checked against
   its annotations (``str``, ``int``, ``bool``, ``list[dict]``, ``X | None``, …): a wrong type
   or an unknown/missing argument is an InvalidInputError naming the argument, never a raw
   Python TypeError from deep inside the job;
2. ``repo`` is confined to the storage roots and replaced by its resolved absolute path, as is each argument
   declared ``InputKind.REPOSITORY`` in ``inputs=`` (a pool job's ``pool``/``source``);
3. each argument the task declares in ``inputs={"pack": InputKind.FILE, ...}`` (an option of
   ``@app.task``) is confined to the incoming dir: a FILE argument is opened here and the task
   receives the open binary file (closed when the job ends); a FILE_OR_DIRECTORY argument
   receives the checked, resolved path;
4. arguments the task declares in ``unsafe={"preserve": rule, ...}`` (:data:`PRESERVATION` for
   repack and gc) may not weaken what protects concurrent readers -- deleting replaced packs at
   once, or sooner than PACKYARD_MAINTENANCE_PRESERVE_FOR -- unless the workers run with
   PACKYARD_ALLOW_UNSAFE_MAINTENANCE=1 (the race harness's negative control, tests).

A direct call of a task function (tests, ``task.apply()`` in-process) is not a delivery and is not
checked: only what arrives through the broker is untrusted.

Time limits (PACKYARD_TIME_LIMITS, per task kind) are the task's ``soft_time_limit`` and
``time_limit``; :class:`BoundedRequest` keeps a message's ``timelimit`` header from raising them
(it may only lower them). :func:`as_job_error` turns the soft limit's exception into a
LimitExceededError naming the limit, which is what the job row records.
"""
from __future__ import annotations

import inspect
import types
import typing
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, Mapping

from celery.exceptions import SoftTimeLimitExceeded
from celery.worker.request import Request

from packyard.store.errors import InvalidInputError, LimitExceededError
from packyard.workers.confine import Confinement, InputKind
from packyard.workers.settings import Settings, get_settings

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "an object",
               list: "a list"}


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _describe(a) for a in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return "a list" + ("" if item is Any else f" of {_describe(item).removeprefix('a ').removeprefix('an ')}s")
    if origin is dict:
        return "an object"
    return _TYPE_NAMES.get(hint, getattr(hint, "__name__", str(hint)))


def _matches(value: Any, hint: Any) -> bool:
    if hint is Any or hint is inspect.Parameter.empty:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is list:
        args = typing.get_args(hint)
        return isinstance(value, list) and (not args or all(_matches(v, args[0]) for v in value))
    if origin is dict:
        return isinstance(value, dict)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # an annotation this checker does not know: left to the command's own checks


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def bind_arguments(fn: Any, task_name: str, args: tuple[Any, ...] | list[Any],
                   kwargs: Mapping[str, Any]) -> inspect.BoundArguments:
    """Bind a message's arguments to ``fn`` (a task's run); InvalidInputError naming the bad argument."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as err:
        raise InvalidInputError(f"{task_name}: {err}") from None
    hints = typing.get_type_hints(fn)
    for name, value in bound.arguments.items():
        hint = hints.get(name, Any)
        if not _matches(value, hint):
            raise InvalidInputError(f"{task_name}: argument {name!r} must be {_describe(hint)}, "
                                    f"got {type(value).__name__} {_shown(value)}")
    return bound


def declared_inputs(task: Any) -> Mapping[str, InputKind]:
    return getattr(task, "inputs", None) or {}


#: A rule answers why a value is unsafe (None: it is not).
UnsafeRule = Callable[[Any, Settings], "str | None"]


def _no_preserve(value: Any, settings: Settings) -> str | None:
    return ("false deletes replaced packs at once, under readers that may still hold them"
            if value is False else None)


def _short_preserve(value: Any, settings: Settings) -> str | None:
    floor = settings.maintenance_preserve_for
    if value is not None and value < floor:
        return (f"({value:g} s) is shorter than PACKYARD_MAINTENANCE_PRESERVE_FOR ({floor:g} s): readers, "
                "on other hosts too, may still hold the replaced packs")
    return None


#: repack and gc: a caller may keep replaced packs longer than the operator's setting, never shorter.
PRESERVATION: dict[str, UnsafeRule] = {"preserve": _no_preserve, "preserve_for": _short_preserve}


def check_safety(task: Any, arguments: Mapping[str, Any], settings: Settings) -> None:
    """Step 4: refuse (InvalidInputError) an explicitly given argument that an ``unsafe`` rule names."""
    if settings.allow_unsafe_maintenance:
        return
    rules: Mapping[str, UnsafeRule] = getattr(task, "unsafe", None) or {}
    for name, rule in rules.items():
        if name in arguments:
            reason = rule(arguments[name], settings)
            if reason is not None:
                raise InvalidInputError(
                    f"{task.name}: argument {name!r} {reason}; refused (PACKYARD_ALLOW_UNSAFE_MAINTENANCE=1 "
                    "allows it, for the race harness's negative control only)")


def check_call(task: Any, args: tuple[Any, ...] | list[Any], kwargs: Mapping[str, Any],
               settings: Settings | None = None) -> dict[str, Any]:
    """What a publisher can check before sending (``packyard submit``): types and paths, nothing opened.

    Returns the keyword arguments with ``repo`` canonicalised. Raises what the worker would.
    """
    settings = settings or get_settings()
    conf = Confinement.from_settings(settings)
    bound = bind_arguments(task.run, task.name, args, kwargs)
    check_safety(task, bound.arguments, settings)
    if "repo" in bound.arguments:
        bound.arguments["repo"] = conf.repository(bound.arguments["repo"])
    for name, kind in declared_inputs(task).items():
        if bound.arguments.get(name) is not None:
            if kind is InputKind.REPOSITORY:
                bound.arguments[name] = conf.repository(bound.arguments[name])
            else:
                conf.input_path(bound.arguments[name], kind, what=name)
    return dict(bound.arguments)


@contextmanager
def prepared(task: Any, args: tuple[Any, ...] | list[Any],
             kwargs: Mapping[str, Any]) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """(args, kwargs) the task body runs with: checked, ``repo`` confined, inputs confined (files opened).

    The files are closed when the block ends. Raises InvalidInputError (the job fails, nothing done).
    """
    settings = get_settings()
    conf = Confinement.from_settings(settings)
    bound = bind_arguments(task.run, task.name, args, kwargs)
    check_safety(task, bound.arguments, settings)
    with ExitStack() as stack:
        if "repo" in bound.arguments:
            bound.arguments["repo"] = conf.repository(bound.arguments["repo"])
        for name, kind in declared_inputs(task).items():
            value = bound.arguments.get(name)
            if value is None:
                continue
            if kind is InputKind.REPOSITORY:
                bound.arguments[name] = conf.repository(value)
            elif kind is InputKind.FILE:
                _path, f = conf.open_input(value, what=name)
                stack.callback(f.close)
                bound.arguments[name] = f
            else:
                bound.arguments[name] = conf.input_path(value, kind, what=name)
        yield bound.args, dict(bound.kwargs)


def as_job_error(task: Any, exc: BaseException) -> BaseException:
    """The error a job row records for ``exc``: the soft time limit becomes a LimitExceededError naming it."""
    if isinstance(exc, SoftTimeLimitExceeded):
        soft, hard = get_settings().time_limit_for(task.name)
        err = LimitExceededError(f"{task.name} ran past its soft time limit of {soft:g} s "
                                 f"(PACKYARD_TIME_LIMITS; hard limit {hard:g} s); stopped, nothing published")
        err.__cause__ = exc
        return err
    return exc


def hard_limit_error(task: Any) -> LimitExceededError:
    soft, hard = get_settings().time_limit_for(task.name)
    return LimitExceededError(f"{task.name} ran past its hard time limit of {hard:g} s (PACKYARD_TIME_LIMITS); "
                              "its worker process was killed")


class BoundedRequest(Request):
    """A delivery whose ``timelimit`` header can lower the task's configured time limits, never raise them."""

    _header_limits: tuple[Any, Any] = (None, None)

    @property  # type: ignore[override]
    def time_limits(self) -> tuple[float | None, float | None]:
        hard_cfg, soft_cfg = self._task.time_limit, self._task.soft_time_limit
        hard, soft = self._header_limits
        return (_lowest(hard, hard_cfg), _lowest(soft, soft_cfg))

    @time_limits.setter
    def time_limits(self, value: Any) -> None:
        try:
            hard, soft = value
        except (TypeError, ValueError):
            hard = soft = None
        self._header_limits = (hard, soft)


def _lowest(asked: Any, configured: float | None) -> float | None:
    if not isinstance(asked, (int, float)) or isinstance(asked, bool) or asked <= 0:
        return configured
    return asked if configured is None else min(asked, configured)
