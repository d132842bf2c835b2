"""The ``hybridmem`` command: a thin typer layer over HybridMemory and the evaluation harness."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hybridmem_local.cli_errors import err, reported
from hybridmem_local.config import ConfigError, load_config
from hybridmem_local.model_registry import ModelRegistryError
from hybridmem_local.ingest import InputFileError, read_sessions_jsonl
from hybridmem_local.llm.base import LLMError
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import Session
from hybridmem_local.store import NotFoundError, StoreError

app = typer.Typer(help="Offline long-term memory for dialogue agents.", no_args_is_help=True, add_completion=False)
console = Console()

DB_OPTION = typer.Option(Path("hybridmem.db"), "--db", envvar="HYBRIDMEM_DB", help="SQLite store file.")
CONFIG_OPTION = typer.Option(None, "--config", "-c", envvar="HYBRIDMEM_CONFIG", help="YAML config (default: built-in paper defaults).")
NAMESPACE_OPTION = typer.Option("default", "--namespace", "-n", help="Namespace (one user or agent).")

#: Errors a user can fix: printed as one clear line, exit code 1, no traceback. sqlite3 and OS
#: errors cover a full disk, a read-only store or a missing directory; LLMError an unreachable
#: server or a missing model.
USER_ERRORS = (
    InputFileError, ConfigError, StoreError, NotFoundError, ModelRegistryError, LLMError, ValueError,
    sqlite3.Error, OSError,
)


def _open(db: Path, config: Optional[Path], overrides: dict | None = None) -> HybridMemory:
    return HybridMemory.open(db, load_config(config, overrides))


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=False
    )


def load_sessions_file(path: Path, namespace: str | None, conversations: list[str] | None = None) -> list[Session]:
    """A LoCoMo JSON file (official format) or a JSONL of sessions, told apart by content.

    LoCoMo conversations go to one namespace each (their turn ids repeat across
    conversations): the sample id, or ``NAMESPACE-sample_id`` when a namespace is given for
    several conversations.
    """
    if not path.exists():
        raise InputFileError(f"{path}: no such file")
    if path.read_bytes()[:64].lstrip()[:1] != b"[":
        return read_sessions_jsonl(path, namespace)
    from hybridmem_local.eval.locomo import load_locomo

    selected = load_locomo(path).conversations
    if conversations:
        unknown = set(conversations) - {c.sample_id for c in selected}
        if unknown:
            raise InputFileError(f"{path}: no conversation {sorted(unknown)} (has {[c.sample_id for c in selected]})")
        selected = [c for c in selected if c.sample_id in conversations]
    if namespace is not None:
        selected = [c.in_namespace(namespace if len(selected) == 1 else f"{namespace}-{c.sample_id}") for c in selected]
    return [s for c in selected for s in c.sessions]


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what each stage does.")) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@app.command()
def ingest(
    path: Path = typer.Argument(..., help="LoCoMo JSON (official format) or sessions JSONL."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="Store every session here (LoCoMo default: one namespace per conversation)."),
    conversation: Optional[list[str]] = typer.Option(None, "--conversation", help="LoCoMo sample ids to ingest (default: all)."),
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
    curate: bool = typer.Option(True, "--curate/--no-curate", help="Curate memories with the configured LLM."),
) -> None:
    """Store sessions (raw turns, then curated memories)."""
    with reported(*USER_ERRORS):
        sessions = load_sessions_file(path, namespace, conversation)
        with _open(db, config) as memory:
            started = time.perf_counter()
            report = memory.ingest(sessions, curate=curate, progress=progress())
            console.print(
                f"ingested {report.stored} sessions ({report.skipped} already present, {report.failed} curation failures) "
                f"with {report.memories} memories in {time.perf_counter() - started:.1f}s"
                + (f"; {report.memories_left_out} written without content were left out" if report.memories_left_out else "")
            )


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
    with reported(*USER_ERRORS):
        with _open(db, config) as memory:
            result = memory.search(query, namespace=namespace, k=k)
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
    with reported(*USER_ERRORS):
        with _open(db, config) as memory:
            console.print_json(memory.stats(namespace).model_dump_json())


@app.command()
def export(
    out: Path = typer.Argument(..., help="JSONL file to write."),
    namespace: str = NAMESPACE_OPTION,
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Export a namespace (sessions and memories with provenance) as JSONL."""
    with reported(*USER_ERRORS):
        with _open(db, config) as memory:
            console.print(f"wrote {memory.export(namespace, out)} records to {out}")


@app.command("import")
def import_(
    path: Path = typer.Argument(..., help="JSONL written by `hybridmem export`."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="Import into this namespace instead."),
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Import a namespace export."""
    with reported(*USER_ERRORS):
        with _open(db, config) as memory:
            console.print(json.dumps(memory.import_(path, namespace)))


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
    with reported(*USER_ERRORS):
        with _open(db, config) as memory:
            console.print_json(json.dumps(memory.forget(namespace)))


@app.command()
def curate(
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="Only this namespace."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Also retry sessions whose curation failed."),
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Curate stored sessions that are not curated yet."""
    with reported(*USER_ERRORS):
        with _open(db, config) as memory:
            started = time.perf_counter()
            report = memory.curate_pending(namespace, retry_failed=retry_failed, progress=progress())
    console.print(
        f"curated {report.curated} sessions ({report.failed} failed) into {report.memories} memories "
        f"with {report.llm_calls} LLM calls in {time.perf_counter() - started:.1f}s"
    )


@app.command()
def ask(
    question: str = typer.Argument(...),
    namespace: str = NAMESPACE_OPTION,
    k: Optional[int] = typer.Option(None, "--k"),
    as_json: bool = typer.Option(False, "--json"),
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Answer a question from the namespace's memories (one LLM call)."""
    with reported(*USER_ERRORS):
        with _open(db, config) as memory:
            answer = memory.answer(question, namespace=namespace, k=k)
    if as_json:
        console.print_json(answer.model_dump_json())
    else:
        print_answer(answer)


def print_answer(answer) -> None:
    console.print(f"[bold]Q:[/] {answer.question}")
    console.print(f"[bold]A:[/] {answer.answer or '(no answer)'}" + (f"  [red]({answer.error})[/]" if answer.error else ""))
    for memory in answer.cited:
        console.print(f"  cites #{memory.id}: {memory.render()}  [dim]turns {', '.join(memory.source_turn_ids) or '-'}[/]")
    console.print(f"[dim]{answer.prompt_tokens} prompt tokens, {answer.latency_s:.1f}s[/]")


DEMO_SESSIONS = Path(__file__).parent / "examples" / "demo_sessions.jsonl"


@app.command()
def demo(
    db: Path = typer.Option(Path("runs/demo/memory.db"), "--db", help="Where the demo store goes."),
    question: list[str] = typer.Option(
        ["How long did Bob need for the Riverside 10K?", "What is the name of Alice's puppy?"], "--question", "-q"
    ),
    config: Optional[Path] = CONFIG_OPTION,
) -> None:
    """The main job on the embedded default, offline: ingest + curate a small conversation, then answer."""
    from hybridmem_local.ingest import read_sessions_jsonl

    started = time.perf_counter()
    db.parent.mkdir(parents=True, exist_ok=True)
    with reported(*USER_ERRORS):
        sessions = read_sessions_jsonl(DEMO_SESSIONS, "demo")
        with _open(db, config) as memory:
            console.print(f"[bold]LLM:[/] {memory.config.llm.backend}:{memory.config.llm.model}  "
                          f"[bold]embedder:[/] {memory.config.embedder.model}  [bold]store:[/] {db}")
            report = memory.ingest(sessions, progress=progress())
            console.print(
                f"curated {report.curated} sessions into {report.memories} memories "
                f"({report.llm_calls} LLM calls, {report.prompt_tokens} prompt / {report.completion_tokens} completion tokens; "
                f"{report.skipped} sessions already stored)"
            )
            for q in question:
                print_answer(memory.answer(q, namespace="demo"))
    console.print(f"done in {time.perf_counter() - started:.1f}s")


@app.command()
def consolidate(
    namespace: str = NAMESPACE_OPTION,
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the clusters and the plan; change nothing."),
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Cluster memories (UMAP → HDBSCAN) and merge/delete them with the LLM, as one undoable run."""
    with reported(*USER_ERRORS):
        with _open(db, config) as memory:
            report = memory.consolidate(namespace, dry_run=dry_run)
    console.print(report.table())


@app.command()
def undo(
    run_id: int = typer.Argument(..., help="A consolidation run id (see `hybridmem consolidate`)."),
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Restore exactly the state before a consolidation run."""
    from hybridmem_local.consolidation import ConsolidationError

    with reported(*USER_ERRORS, ConsolidationError):
        with _open(db, config) as memory:
            console.print_json(memory.undo(run_id).model_dump_json())


@app.command()
def purge(
    older_than_days: float = typer.Option(..., "--older-than", help="Days since a memory was superseded or deleted."),
    namespace: str = NAMESPACE_OPTION,
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Physically remove memories retired longer ago than --older-than days (with their history)."""
    from datetime import timedelta

    with reported(*USER_ERRORS):
        with _open(db, config) as memory:
            console.print_json(memory.purge(namespace, timedelta(days=older_than_days)).model_dump_json())


@app.command()
def doctor(
    config: Optional[Path] = CONFIG_OPTION,
    verify: bool = typer.Option(False, "--verify", help="Also recompute model checksums."),
) -> None:
    """Resolved models, backends (CPU/GPU, cuML, vLLM), the config in force, offline mode."""
    from hybridmem_local.offline import doctor_report, enforce_offline, print_doctor

    with reported(*USER_ERRORS):
        cfg = load_config(config)
    enforce_offline(cfg.offline.allow_network)
    print_doctor(doctor_report(cfg, verify=verify, source=str(config) if config else None), console)


def _mount_subcommands() -> None:
    from hybridmem_local.cli_models import app as models_app

    app.add_typer(models_app, name="models", help="Model manifest: list, verify, download, bundle, install-bundle.")
    from hybridmem_local.cli_eval import app as eval_app
    app.add_typer(eval_app, name="eval", help="Benchmark runs (LoCoMo, LongMemEval) and their reports.")


_mount_subcommands()


def main() -> None:  # pragma: no cover - console entry
    app()
