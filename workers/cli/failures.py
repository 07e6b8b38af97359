"""How a CLI command fails: a store error is one line on stderr and exit status 1 (``CommandFailed``)."""
from __future__ import annotations

import sys
from typing import Any


class CommandFailed(Exception):
    """A store error already reported on stderr; the command exits with status 1."""


def call_store(command: str, bar: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """Run one store-backed command function; close its progress bar however it ends.

    A StoreError (bad input, corrupt data, a ref that moved) becomes one line on stderr,
    ``packyard <command>: <ErrorType>: <message naming file/object/offset>``, and
    CommandFailed, which ``main`` turns into exit status 1.
    """
    from packyard.store.errors import StoreError

    try:
        return fn(*args, **kwargs)
    except StoreError as err:
        print(f"packyard {command}: {type(err).__name__}: {err}", file=sys.stderr)
        raise CommandFailed(str(err)) from err
    finally:
        if bar:
            bar.close()
