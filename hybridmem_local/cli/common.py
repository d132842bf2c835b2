"""What every ``hybridmem`` command shares: the option bundles (the store, the config, the
output), ``--set`` config overrides, and printing data as a table or as JSON.

The rule (sqlite-utils'): the CLI is the Python API with flags. A command that prints data
prints a table by default and the same data as JSON with ``--json`` (one JSON document on
stdout, ready for ``jq``); a command that reads a file reads standard input for ``-``.

The options every command repeats are declared once, as the fields of a bundle
(:class:`StoreOptions`, :class:`ConfigOptions`, :class:`Output`). A command takes the bundle
as one keyword-only parameter and :func:`with_options` gives it the bundle's options::

    @with_options
    def get(memory_id: MemoryId, *, store: StoreOptions, output: Output) -> None:
        with store.open_memory() as memory:
            found = memory.get(memory_id)
        output.show(found)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import sqlalchemy as sa
import typer
import yaml
from pydantic_core import to_jsonable_python
from rich.table import Table

from hybridmem_local.cli.console import console
from hybridmem_local.cli.errors import reported
from hybridmem_local.config import Config, load_config
from hybridmem_local.errors import HybridMemError
from hybridmem_local.storage import encryption

if TYPE_CHECKING:
    from hybridmem_local.memory import HybridMemory
    from hybridmem_local.storage.store import MemoryStore

#: Errors a user can fix: printed as one clear line, exit code 1, no traceback. The library's
#: own errors name what is wrong (a bad file, config or argument, a missing model, an unreachable
#: LLM server); sqlite3 and OS errors cover a full disk, a read-only store or a missing directory.
USER_ERRORS: tuple[type[BaseException], ...] = (
    HybridMemError,
    ValueError,
    *encryption.Error,
    OSError,
    # The database refused a statement (full disk, read-only file): the driver's one line.
    sa.exc.OperationalError,
)

JSON_HELP = "Print the result as JSON instead of a table."
#: ``--json`` as a parameter default, for a command that takes no bundle (``hybridmem models``).
JSON_OPTION = typer.Option(False, "--json", help=JSON_HELP)

#: ``--namespace`` where a command acts on one namespace (``default`` unless given).
Namespace = Annotated[str, typer.Option("--namespace", "-n", help="Namespace (one user or agent).")]
#: ``--namespace`` where a command acts on every namespace unless given one.
NamespaceFilter = Annotated[str | None, typer.Option("--namespace", "-n", help="Only this namespace.")]
MemoryId = Annotated[int, typer.Argument(help="A memory id.")]


@dataclass(frozen=True)
class Output:
    """``--json``: how a command prints its data."""

    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False

    def show(self, data: Any, columns: Iterable[str] | None = None, title: str | None = None) -> None:
        print_data(data, self.as_json, columns, title)


@dataclass(frozen=True)
class ConfigOptions:
    """``--config`` and ``--set``: the config a command runs with."""

    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            envvar="HYBRIDMEM_CONFIG",
            help="YAML config (default: built-in paper defaults; - reads stdin).",
        ),
    ] = None
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="Config override KEY=VALUE (dotted key, YAML value), repeatable."),
    ] = None

    @functools.cached_property
    def config(self) -> Config:
        """The file (or the defaults) with ``--set`` applied, read once (``-`` is standard input);
        a bad one is a one-line error."""
        overrides = parse_overrides(self.overrides)
        with reported(*USER_ERRORS):
            return load_config(self.config_file, overrides)


@dataclass(frozen=True)
class StoreOptions(ConfigOptions):
    """``--db`` besides the config: the store a command works on."""

    db: Annotated[
        Path,
        typer.Option(
            "--db", envvar="HYBRIDMEM_DB", help="SQLite store file (unless store.url names a PostgreSQL database)."
        ),
    ] = Path("hybridmem.db")

    @contextmanager
    def open_memory(self) -> Iterator[HybridMemory]:
        """The store opened as a ``HybridMemory``; what a user can fix, raised in the block, is a one-line error."""
        from hybridmem_local.memory import HybridMemory

        with reported(*USER_ERRORS), HybridMemory.open(self.db, self.config) as memory:
            yield memory

    @contextmanager
    def open_store(self) -> Iterator[MemoryStore]:
        """The bare store (no embedder, no LLM), for the owner's commands that are no memory
        operation (API keys, the audit trail); errors as :meth:`open_memory`."""
        from hybridmem_local.storage.store import MemoryStore

        with reported(*USER_ERRORS):
            store = MemoryStore.open(self.db, self.config.store)
            try:
                yield store
            finally:
                store.close()


_BUNDLES = (Output, ConfigOptions)


def with_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with each parameter typed as a bundle (``Output``, ``ConfigOptions``,
    ``StoreOptions``) replaced by the bundle's options, after the command's own; called, the
    command gets the bundle built from them."""
    signature = inspect.signature(command, eval_str=True)
    bundles = {
        name: parameter.annotation
        for name, parameter in signature.parameters.items()
        if isinstance(parameter.annotation, type) and issubclass(parameter.annotation, _BUNDLES)
    }
    parameters = [parameter for name, parameter in signature.parameters.items() if name not in bundles]
    for bundle in bundles.values():
        hints = typing.get_type_hints(bundle, include_extras=True)
        parameters += [
            inspect.Parameter(
                field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default, annotation=hints[field.name]
            )
            for field in dataclasses.fields(bundle)
        ]
    names = [parameter.name for parameter in parameters]
    clashes = sorted({name for name in names if names.count(name) > 1})
    if clashes:
        raise TypeError(f"{command.__name__}: parameters named like a bundle's options: {clashes}")

    @functools.wraps(command)
    def run(**options: Any) -> None:
        for name, bundle in bundles.items():
            options[name] = bundle(**{field.name: options.pop(field.name) for field in dataclasses.fields(bundle)})
        command(**options)

    # Typer reads the options from the signature (its annotations already resolved).
    run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    run.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return run


def parse_overrides(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``["retrieval.k=5", "llm.backend=transformers"]`` → ``{"retrieval.k": 5, ...}`` (values read as YAML)."""
    overrides = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--set")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


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
