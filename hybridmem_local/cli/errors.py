"""How every ``hybridmem`` command reports an error the user can fix: one red line, exit code 1."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from hybridmem_local.cli.console import err


def fail(message: object) -> typer.Exit:
    """Print ``message`` as an error and return the exit to raise."""
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=1)


@contextmanager
def reported(*errors: type[BaseException]) -> Iterator[None]:
    """Turn ``errors`` raised inside the block into :func:`fail` (no traceback for fixable mistakes)."""
    try:
        yield
    except errors as exc:
        # A database error wrapped by SQLAlchemy: the driver's own words, without the statement.
        raise fail(getattr(exc, "orig", None) or exc) from exc
