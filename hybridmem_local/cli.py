"""The ``hybridmem`` command: a thin typer layer over HybridMemory and the evaluation harness."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hybridmem_local.config import ConfigError, load_config
from hybridmem_local.ingest import InputFileError, read_sessions_jsonl
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import Session
from hybridmem_local.store import NotFoundError, StoreError

app = typer.Typer(help="Offline long-term memory for dialogue agents.", no_args_is_help=True, add_completion=False)
console = Console()
err = Console(stderr=True)

DB_OPTION = typer.Option(Path("hybridmem.db"), "--db", envvar="HYBRIDMEM_DB", help="SQLite store file.")
CONFIG_OPTION = typer.Option(None, "--config", "-c", envvar="HYBRIDMEM_CONFIG", help="YAML config (default: built-in paper defaults).")
NAMESPACE_OPTION = typer.Option("default", "--namespace", "-n", help="Namespace (one user or agent).")

#: Errors a user can fix: printed as one clear line, exit code 1, no traceback.
USER_ERRORS = (InputFileError, ConfigError, StoreError, NotFoundError, ValueError, FileNotFoundError)


def _fail(exc: BaseException) -> typer.Exit:
    err.print(f"[bold red]error:[/] {exc}")
    return typer.Exit(code=1)


def _open(db: Path, config: Optional[Path], overrides: dict | None = None) -> HybridMemory:
    return HybridMemory.open(db, load_config(config, overrides))


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=False
    )


def load_sessions_file(path: Path, namespace: str | None) -> list[Session]:
    """A LoCoMo JSON file (official format) or a JSONL of sessions, by content."""
    if not path.exists():
        raise InputFileError(f"{path}: no such file")
    head = path.read_bytes()[:1].lstrip()
    if path.suffix == ".json" or head == b"[":
        from hybridmem_local.eval.locomo import load_locomo

        dataset = load_locomo(path)
        sessions = []
        for conversation in dataset.conversations:
            sessions.extend(conversation.sessions_in(namespace) if namespace not in (None, "default") else conversation.sessions)
        return sessions
    return read_sessions_jsonl(path, namespace)


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what each stage does.")) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@app.command()
def ingest(
    path: Path = typer.Argument(..., help="LoCoMo JSON (official format) or sessions JSONL."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="Store every session here (LoCoMo default: one namespace per conversation)."),
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
    curate: bool = typer.Option(True, "--curate/--no-curate", help="Curate memories with the configured LLM."),
) -> None:
    """Store sessions (raw turns, then curated memories)."""
    try:
        sessions = load_sessions_file(path, namespace)
        with _open(db, config) as memory:
            started = time.perf_counter()
            report = memory.ingest(sessions, curate=curate, progress=progress())
            console.print(
                f"ingested {report.stored} sessions ({report.skipped} already present, {report.failed} curation failures) "
                f"with {report.memories} memories in {time.perf_counter() - started:.1f}s"
            )
    except USER_ERRORS as exc:
        raise _fail(exc)


@app.command()
def search(
    query: str = typer.Argument(...),
    namespace: str = NAMESPACE_OPTION,
    k: Optional[int] = typer.Option(None, "--k", help="Episodes to return (tuples: 2k). Default from config."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Top-k episodes and top-2k tuples for a query (no LLM call)."""
    try:
        with _open(db, config) as memory:
            result = memory.search(query, namespace=namespace, k=k)
    except USER_ERRORS as exc:
        raise _fail(exc)
    if as_json:
        console.print_json(result.model_dump_json())
        return
    table = Table("id", "kind", "score", "memory", "turns")
    for hit in result.episodes + result.tuples:
        m = hit.memory
        table.add_row(str(m.id), m.kind, f"{hit.score:.3f}", m.render(), ",".join(m.source_turn_ids))
    console.print(table)


@app.command()
def stats(namespace: Optional[str] = typer.Option(None, "--namespace", "-n"), db: Path = DB_OPTION, config: Optional[Path] = CONFIG_OPTION) -> None:
    """Counts of sessions, turns and memories by status."""
    try:
        with _open(db, config) as memory:
            console.print_json(memory.stats(namespace).model_dump_json())
    except USER_ERRORS as exc:
        raise _fail(exc)


@app.command()
def export(
    out: Path = typer.Argument(..., help="JSONL file to write."),
    namespace: str = NAMESPACE_OPTION,
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Export a namespace (sessions and memories with provenance) as JSONL."""
    try:
        with _open(db, config) as memory:
            console.print(f"wrote {memory.export(namespace, out)} records to {out}")
    except USER_ERRORS as exc:
        raise _fail(exc)


@app.command("import")
def import_(
    path: Path = typer.Argument(..., help="JSONL written by `hybridmem export`."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="Import into this namespace instead."),
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Import a namespace export."""
    try:
        with _open(db, config) as memory:
            console.print(json.dumps(memory.import_(path, namespace)))
    except USER_ERRORS as exc:
        raise _fail(exc)


@app.command()
def forget(
    namespace: str = typer.Option(..., "--namespace", "-n"),
    yes: bool = typer.Option(False, "--yes", help="Do not ask for confirmation."),
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Remove every trace of a namespace (rows, history, vectors, index files, exports, LLM cache)."""
    if not yes and not typer.confirm(f"Permanently remove namespace {namespace!r}?"):
        raise typer.Exit(code=1)
    try:
        with _open(db, config) as memory:
            console.print_json(json.dumps(memory.forget(namespace)))
    except USER_ERRORS as exc:
        raise _fail(exc)


def main() -> None:  # pragma: no cover - console entry
    app()
