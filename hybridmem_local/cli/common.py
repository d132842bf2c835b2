"""What every ``hybridmem`` command shares: the store/config/namespace options, ``--set``
config overrides, ``--json``, and printing data as a table or as JSON.

The rule (sqlite-utils'): the CLI is the Python API with flags. A command that prints data
prints a table by default and the same data as JSON with ``--json`` (one JSON document on
stdout, ready for ``jq``); a command that reads a file reads standard input for ``-``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import typer
import yaml
from pydantic_core import to_jsonable_python
from rich.table import Table

from hybridmem_local.cli.console import console
from hybridmem_local.config import Config, load_config
from hybridmem_local.errors import HybridMemError
from hybridmem_local.storage import encryption

#: Errors a user can fix: printed as one clear line, exit code 1, no traceback. The library's
#: own errors name what is wrong (a bad file, config or argument, a missing model, an unreachable
#: LLM server); sqlite3 and OS errors cover a full disk, a read-only store or a missing directory.
USER_ERRORS: tuple[type[BaseException], ...] = (HybridMemError, ValueError, *encryption.Error, OSError)

DB_OPTION = typer.Option(Path("hybridmem.db"), "--db", envvar="HYBRIDMEM_DB", help="SQLite store file.")
CONFIG_OPTION = typer.Option(
    None,
    "--config",
    "-c",
    envvar="HYBRIDMEM_CONFIG",
    help="YAML config (default: built-in paper defaults; - reads stdin).",
)
NAMESPACE_OPTION = typer.Option("default", "--namespace", "-n", help="Namespace (one user or agent).")
SET_OPTION = typer.Option(None, "--set", help="Config override KEY=VALUE (dotted key, YAML value), repeatable.")
JSON_OPTION = typer.Option(False, "--json", help="Print the result as JSON instead of a table.")


def parse_overrides(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``["retrieval.k=5", "llm.backend=transformers"]`` → ``{"retrieval.k": 5, ...}`` (values read as YAML)."""
    overrides = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--set")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def config_from(path: Path | None, overrides: Sequence[str] | None) -> Config:
    """The config a command runs with: the file (or defaults) with ``--set`` applied."""
    return load_config(path, parse_overrides(overrides))


def open_memory(db: Path, config: Path | None, overrides: Sequence[str] | None = None):
    from hybridmem_local.memory import HybridMemory

    return HybridMemory.open(db, config_from(config, overrides))


def jsonable(data: Any) -> Any:
    """Pydantic models, dates, paths and enums as plain JSON values."""
    return to_jsonable_python(data)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(jsonable(data), indent=2, ensure_ascii=False))


def print_data(data: Any, as_json: bool, columns: Iterable[str] | None = None, title: str | None = None) -> None:
    """``data`` as JSON (``as_json``) or as a table: a list of records one row each (``columns``
    picks and orders them; default the first record's keys), a single record one row per field."""
    if as_json:
        print_json(data)
        return
    plain = jsonable(data)
    if isinstance(plain, list):
        names = (
            list(columns)
            if columns is not None
            else (list(plain[0]) if plain and isinstance(plain[0], dict) else ["value"])
        )
        table = Table(*names, title=title)
        for row in plain:
            table.add_row(*(_cell(row.get(name) if isinstance(row, dict) else row) for name in names))
    else:
        table = Table("field", "value", title=title)
        for name, value in plain.items() if isinstance(plain, dict) else [("value", plain)]:
            table.add_row(name, _cell(value))
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, (str, int)) for v in value):
        return ", ".join(map(str, value))
    return json.dumps(value, ensure_ascii=False)
