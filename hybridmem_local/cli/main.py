"""The ``hybridmem`` command: a thin typer layer over HybridMemory and the evaluation harness.

The CLI is the Python API with flags: ``add``, ``get``, ``list``, ``update``, ``delete``,
``history``, ``search``, ``ask`` map onto :class:`~hybridmem_local.memory.HybridMemory`'s
methods of the same names. Every command that prints data takes ``--json``; every command
that reads the config takes ``--set KEY=VALUE``; ``-`` reads standard input where a file is
read (``ingest``, ``add``, ``import``, ``--config``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import date, timedelta
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from hybridmem_local.cli.common import (
    CONFIG_OPTION,
    DB_OPTION,
    JSON_OPTION,
    NAMESPACE_OPTION,
    SET_OPTION,
    USER_ERRORS,
    config_from,
    console,
    open_memory,
    print_data,
    print_json,
)
from hybridmem_local.cli.errors import err, fail, reported
from hybridmem_local.files.sessions import read_sessions_file, read_sessions_jsonl
from hybridmem_local.schema import Episode, RelationalTuple, WindowHit

if TYPE_CHECKING:
    from hybridmem_local.memory import IngestReport

app = typer.Typer(help="Offline long-term memory for dialogue agents.", no_args_is_help=True, add_completion=False)

#: The columns a memory is shown with in tables.
MEMORY_COLUMNS = ("id", "kind", "status", "timestamp", "memory", "turns", "provenance")


class Kind(str, Enum):
    episode = "episode"
    tuple = "tuple"


class Status(str, Enum):
    """``MemoryStatus`` as a choice of ``list --status``, with ``any``."""

    active = "active"
    superseded = "superseded"
    deleted = "deleted"
    any = "any"


def progress(description: str = "curating sessions") -> Callable[[int, int], None]:
    """An ``on_progress(done, total)`` callback for the library that draws a bar on stderr: it
    starts with the first call and stops when done reaches total."""
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )
    tasks: list[TaskID] = []

    def on_progress(done: int, total: int) -> None:
        if not tasks:
            bar.start()
            tasks.append(bar.add_task(description, total=total))
        bar.update(tasks[0], completed=done, total=total)
        if done >= total:
            bar.stop()

    return on_progress


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what each stage does.")) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


def curation_notes(report: IngestReport) -> str:
    """What the write-time checks did to the curated memories, when they did anything."""
    notes = [f"{report.duplicates_skipped} repeats not stored again"] if report.duplicates_skipped else []
    notes += [f"{report.memories_aligned} aligned to their turns"] if report.memories_aligned else []
    return "".join(f"; {note}" for note in notes)


def memory_row(memory: Episode | RelationalTuple) -> dict:
    """A memory as one table row: its rendered line instead of its separate fields."""
    return {
        "id": memory.id,
        "kind": memory.kind,
        "status": memory.status.value,
        "timestamp": memory.timestamp,
        "memory": memory.render(),
        "turns": memory.source_turn_ids,
        "provenance": memory.provenance,
    }


def print_memories(memories: list[Episode | RelationalTuple], as_json: bool, title: str | None = None) -> None:
    if as_json:
        print_json(memories)
    else:
        print_data([memory_row(m) for m in memories], False, MEMORY_COLUMNS, title=title)


# --------------------------------------------------------------------------- sessions in


@app.command()
def ingest(
    path: Path = typer.Argument(..., help="LoCoMo JSON (official format) or sessions JSONL; - reads stdin."),
    namespace: str | None = typer.Option(
        None, "--namespace", "-n", help="Store every session here (LoCoMo default: one namespace per conversation)."
    ),
    conversation: list[str] | None = typer.Option(
        None, "--conversation", help="LoCoMo sample ids to ingest (default: all)."
    ),
    curate: bool = typer.Option(True, "--curate/--no-curate", help="Curate memories with the configured LLM."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Store sessions (raw turns, then curated memories)."""
    with reported(*USER_ERRORS):
        sessions = read_sessions_file(path, namespace, conversation)
        with open_memory(db, config, overrides) as memory:
            started = time.perf_counter()
            report = memory.ingest(sessions, curate=curate, on_progress=progress())
    if as_json:
        print_json(report)
        return
    console.print(
        f"ingested {report.stored} sessions ({report.skipped} already present, {report.failed} curation failures) "
        f"with {report.memories} memories in {time.perf_counter() - started:.1f}s"
        + (
            f"; {report.memories_left_out} left out (no content, or not from the conversation)"
            if report.memories_left_out
            else ""
        )
        + curation_notes(report)
    )


@app.command()
def add(
    path: Path = typer.Argument(..., help="Sessions JSONL (one session a line); - reads stdin."),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help="Namespace of sessions that name none."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Add sessions one by one (``HybridMemory.add_session``) and show the memories curated from each."""
    with reported(*USER_ERRORS):
        sessions = read_sessions_jsonl(path, namespace)
        with open_memory(db, config, overrides) as memory:
            results = [memory.add_session(session) for session in sessions]
    if as_json:
        print_json(results)
        return
    for result in results:
        record = result.session
        title = f"session {record.session.session_id} ({record.session.namespace}): {record.curation_status}" + (
            ", already stored" if result.report.skipped else ""
        )
        print_memories(result.memories, False, title=title)


@app.command()
def curate(
    namespace: str | None = typer.Option(None, "--namespace", "-n", help="Only this namespace."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Also retry sessions whose curation failed."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Curate stored sessions that are not curated yet."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        started = time.perf_counter()
        report = memory.curate_pending(namespace, retry_failed=retry_failed, on_progress=progress())
    if as_json:
        print_json(report)
        return
    console.print(
        f"curated {report.curated} sessions ({report.failed} failed) into {report.memories} memories "
        f"with {report.usage.requests} LLM calls in {time.perf_counter() - started:.1f}s" + curation_notes(report)
    )


# --------------------------------------------------------------------------- memories


@app.command()
def get(
    memory_id: int = typer.Argument(..., help="A memory id."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """One memory with every field (any status)."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        found = memory.get(memory_id)
    print_data(found, as_json)


@app.command("list")
def list_(
    namespace: str = NAMESPACE_OPTION,
    kind: Kind | None = typer.Option(None, "--kind", help="Only episodes or only tuples."),
    status: Status = typer.Option(Status.active, "--status", help="Memories of this status (any: all)."),
    limit: int | None = typer.Option(None, "--limit", min=0, help="At most this many."),
    offset: int = typer.Option(0, "--offset", min=0, help="Skip this many first."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """A namespace's memories in id order, a page at a time."""
    from hybridmem_local.schema import MemoryStatus

    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        memories = memory.list(
            namespace,
            kind=kind.value if kind else None,
            status=None if status is Status.any else MemoryStatus(status.value),
            limit=limit,
            offset=offset,
        )
    print_memories(memories, as_json)


@app.command()
def update(
    memory_id: int = typer.Argument(..., help="An active memory's id."),
    title: str | None = typer.Option(None, "--title", help="Episode title."),
    summary: str | None = typer.Option(None, "--summary", help="Episode summary."),
    details: str | None = typer.Option(None, "--details", help="Episode details."),
    entity: str | None = typer.Option(None, "--entity", help="Tuple entity."),
    relation: str | None = typer.Option(None, "--relation", help="Tuple relation."),
    object_: str | None = typer.Option(None, "--object", help="Tuple object."),
    context: str | None = typer.Option(None, "--context", help="Tuple context."),
    timestamp: str | None = typer.Option(None, "--timestamp", help="YYYY-MM-DD."),
    turns: list[str] | None = typer.Option(None, "--turn", help="Source turn id (repeatable; replaces the list)."),
    reason: str = typer.Option("updated by user", "--reason", help="Recorded in the memory's history."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Change a memory: the new version supersedes the old one (see `hybridmem history`)."""
    given = {
        "title": title,
        "summary": summary,
        "details": details,
        "entity": entity,
        "relation": relation,
        "object": object_,
        "context": context,
        "timestamp": timestamp,
        "source_turn_ids": turns,
    }
    fields = {name: value for name, value in given.items() if value is not None}
    if not fields:
        raise fail("nothing to update: give at least one field (--title, --details, --object, ...)")
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        updated = memory.update(memory_id, reason=reason, **fields)
    print_data(updated, as_json)


@app.command()
def delete(
    memory_id: int = typer.Argument(..., help="A memory id."),
    reason: str = typer.Option("deleted by user", "--reason", help="Recorded in the memory's history."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Mark a memory deleted (its history stays; `hybridmem purge` removes it for good)."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        memory.delete(memory_id, reason=reason)
        deleted = memory.get(memory_id)
    print_data(deleted, as_json)


@app.command()
def history(
    memory_id: int = typer.Argument(..., help="A memory id."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Every event of a memory, oldest first (add, update, merge, delete, ...)."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        events = memory.history(memory_id)
    print_data(events, as_json, ("id", "at", "action", "run_id", "reason", "before", "after"))


@app.command()
def search(
    query: str = typer.Argument(...),
    namespace: str = NAMESPACE_OPTION,
    k: int | None = typer.Option(None, "--k", help="Episodes to return (tuples: 2k). Default from config."),
    kind: list[Kind] | None = typer.Option(None, "--kind", help="Search only these stores (repeatable)."),
    since: str | None = typer.Option(None, "--since", help="Memories dated on or after YYYY-MM-DD."),
    until: str | None = typer.Option(None, "--until", help="Memories dated on or before YYYY-MM-DD."),
    min_score: float | None = typer.Option(None, "--min-score", help="Drop hits scoring below this."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Top-k episodes and top-2k tuples for a query, and the top-k windows of raw turns when
    windows are a retrieval source (the default); no LLM call. A table of the memories and one
    of the windows (a row each: its session, date, turn ids and text)."""
    with reported(*USER_ERRORS):
        period = {"since": _day(since, "--since"), "until": _day(until, "--until")}
        with open_memory(db, config, overrides) as memory:
            result = memory.search(
                query,
                namespace=namespace,
                k=k,
                kinds=[x.value for x in kind] if kind else None,
                min_score=min_score,
                **period,
            )
    if as_json:
        print_json(result)
        return
    memories = Table("id", "kind", "score", "memory", "turns", "provenance", title="memories")
    for hit in result.episodes + result.tuples:
        m = hit.memory
        memories.add_row(
            str(m.id), m.kind, f"{hit.score:.3f}", m.render(), ",".join(m.source_turn_ids), m.provenance or "-"
        )
    # A store searched before curation (or with windows only) finds its answer in the windows:
    # an empty memories table above them would read as "nothing found".
    if result.episodes or result.tuples or not result.windows:
        console.print(memories)
    if result.windows:
        console.print(windows_table(result.windows))


def windows_table(hits: list[WindowHit]) -> Table:
    """Evidence windows, one row each: the raw turns (speaker: text, a line each) of one session."""
    table = Table("score", "session", "date", "turns", "text", title="conversation windows")
    for hit in hits:
        window = hit.window
        table.add_row(
            f"{hit.score:.3f}",
            window.session_id,
            f"{window.session_date:%Y-%m-%d %H:%M}",
            ",".join(window.turn_ids),
            window.index_text(),
        )
    return table


def _day(value: str | None, option: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"expected YYYY-MM-DD, got {value!r}", param_hint=option) from None


@app.command()
def ask(
    questions: list[str] = typer.Argument(..., help="One question, or several answered in one batched LLM call."),
    namespace: str = NAMESPACE_OPTION,
    k: int | None = typer.Option(None, "--k"),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Answer questions from the namespace's memories (one LLM call for all of them)."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        if len(questions) == 1:
            answers = [memory.answer(questions[0], namespace=namespace, k=k)]
        else:
            answers = memory.answer_many(questions, namespace=namespace, k=k)
    if as_json:
        print_json(answers[0] if len(answers) == 1 else answers)
        return
    for answer in answers:
        print_answer(answer)


def print_answer(answer) -> None:
    console.print(f"[bold]Q:[/] {answer.question}")
    console.print(
        f"[bold]A:[/] {answer.answer or '(no answer)'}" + (f"  [red]({answer.error})[/]" if answer.error else "")
    )
    for memory in answer.cited:
        console.print(
            f"  cites #{memory.id}: {memory.render()}  [dim]turns {', '.join(memory.source_turn_ids) or '-'} "
            f"({memory.provenance or 'no provenance'})[/]"
        )
    console.print(f"[dim]{answer.prompt_tokens} prompt tokens, {answer.latency_s:.1f}s[/]")


# --------------------------------------------------------------------------- namespaces


@app.command()
def stats(
    namespace: str | None = typer.Option(None, "--namespace", "-n"),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Counts of sessions, turns and memories by status."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        print_data(memory.stats(namespace), as_json)


@app.command()
def export(
    out: Path = typer.Argument(..., help="JSONL file to write."),
    namespace: str = NAMESPACE_OPTION,
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Export a namespace (sessions and memories with provenance) as JSONL."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        records = memory.export(namespace, out)
    if as_json:
        print_json({"records": records, "path": str(out)})
    else:
        console.print(f"wrote {records} records to {out}")


@app.command("import")
def import_(
    path: Path = typer.Argument(..., help="JSONL written by `hybridmem export`; - reads stdin."),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help="Import into this namespace instead."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Import a namespace export."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        print_data(memory.import_(path, namespace), as_json)


@app.command()
def forget(
    namespace: str = typer.Option(..., "--namespace", "-n"),
    yes: bool = typer.Option(False, "--yes", help="Do not ask for confirmation."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Remove every trace of a namespace (rows, history, vectors, index files, exports, LLM cache)."""
    if not yes and not typer.confirm(f"Permanently remove namespace {namespace!r}?"):
        raise typer.Exit(code=1)
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        print_data(memory.forget(namespace), as_json)


DEMO_SESSIONS = Path(__file__).parent.parent / "examples" / "demo_sessions.jsonl"


@app.command()
def demo(
    db: Path = typer.Option(Path("runs/demo/memory.db"), "--db", help="Where the demo store goes."),
    question: list[str] = typer.Option(
        ["How long did Bob need for the Riverside 10K?", "What is the name of Alice's puppy?"], "--question", "-q"
    ),
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """The main job on the embedded default, offline: ingest + curate a small conversation, then answer."""
    from hybridmem_local.cli.doctor import require_models
    from hybridmem_local.memory import HybridMemory

    started = time.perf_counter()
    with reported(*USER_ERRORS):
        settings = config_from(config, overrides)
        require_models(settings, "the demo")  # before anything loads or is written
        sessions = read_sessions_jsonl(DEMO_SESSIONS, "demo")
        db.parent.mkdir(parents=True, exist_ok=True)
        with HybridMemory.open(db, settings) as memory:
            console.print(
                f"[bold]LLM:[/] {memory.config.llm.backend}:{memory.config.llm.model}  "
                f"[bold]embedder:[/] {memory.embedder.model_id}  [bold]store:[/] {db}"
            )
            report = memory.ingest(sessions, on_progress=progress())
            console.print(
                f"curated {report.curated} sessions into {report.memories} memories "
                f"({report.usage.requests} LLM calls, {report.usage.prompt_tokens} prompt / "
                f"{report.usage.completion_tokens} completion tokens; "
                f"{report.skipped} sessions already stored)" + curation_notes(report)
            )
            for answer in memory.answer_many(question, namespace="demo"):  # decoded together
                print_answer(answer)
    console.print(f"done in {time.perf_counter() - started:.1f}s")


# --------------------------------------------------------------------------- consolidation


@app.command()
def consolidate(
    namespace: str = NAMESPACE_OPTION,
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the clusters and the plan; change nothing."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Cluster memories (UMAP → HDBSCAN) and merge/delete them with the LLM, as one undoable run."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        report = memory.consolidate(namespace, dry_run=dry_run)
    if as_json:
        print_json(report)
    else:
        console.print(report.table())


@app.command()
def undo(
    run_id: int = typer.Argument(..., help="A consolidation run id (see `hybridmem consolidate`)."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Restore exactly the state before a consolidation run."""

    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        print_data(memory.undo(run_id), as_json)


@app.command()
def purge(
    older_than_days: float = typer.Option(..., "--older-than", help="Days since a memory was superseded or deleted."),
    namespace: str = NAMESPACE_OPTION,
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Physically remove memories retired longer ago than --older-than days (with their history)."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        print_data(memory.purge(namespace, timedelta(days=older_than_days)), as_json)


redactions_app = typer.Typer(
    help="Content removed because a user asked, in a conversation, to forget it: list, undo, confirm.",
    no_args_is_help=True,
    add_completion=False,
)


class RedactionStatusChoice(str, Enum):
    pending = "pending"
    confirmed = "confirmed"
    undone = "undone"


@redactions_app.command("list")
def redactions_list(
    namespace: str = NAMESPACE_OPTION,
    status: RedactionStatusChoice | None = typer.Option(None, "--status", help="Only redactions with this status."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """The namespace's redactions, oldest first: what was asked, which turns and memories changed."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        found = memory.redactions(namespace, None if status is None else status.value)
    columns = ("id", "session_id", "created_at", "status", "requests", "turn_ids", "rewritten", "deleted", "undoable")
    print_data(found, as_json, columns=columns)


@redactions_app.command("undo")
def redactions_undo(
    redaction_id: int = typer.Argument(..., help="A pending redaction's id (see `hybridmem redactions list`)."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Put back exactly what a pending redaction removed."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        print_data(memory.undo_redaction(redaction_id), as_json)


@redactions_app.command("confirm")
def redactions_confirm(
    redaction_id: int = typer.Argument(..., help="A pending redaction's id (see `hybridmem redactions list`)."),
    as_json: bool = JSON_OPTION,
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Delete a pending redaction's originals for good (no undo after)."""
    with reported(*USER_ERRORS), open_memory(db, config, overrides) as memory:
        print_data(memory.confirm_redaction(redaction_id), as_json)


app.add_typer(redactions_app, name="redactions")


@app.command()
def doctor(
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
    verify: bool = typer.Option(False, "--verify", help="Also recompute model checksums."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Resolved models, backends (CPU/GPU, cuML, vLLM), the config in force, offline mode."""
    from hybridmem_local.cli.doctor import doctor_report, print_doctor

    with reported(*USER_ERRORS):
        cfg = config_from(config, overrides)
    report = doctor_report(cfg, verify=verify, source=str(config) if config else None)
    if as_json:
        print_json(report)
    else:
        print_doctor(report, console)


def _mount_subcommands() -> None:
    from hybridmem_local.cli.audit import app as audit_app
    from hybridmem_local.cli.encryption import encrypt, master_key_app
    from hybridmem_local.cli.eval import app as eval_app
    from hybridmem_local.cli.models import app as models_app
    from hybridmem_local.cli.service import keys_app, mcp_stdio, serve

    app.command()(serve)
    app.command("mcp")(mcp_stdio)
    app.add_typer(keys_app, name="keys")
    app.command()(encrypt)
    app.add_typer(master_key_app, name="master-key")
    app.add_typer(audit_app, name="audit")
    app.add_typer(models_app, name="models", help="Model manifest: list, verify, download, bundle, install-bundle.")
    app.add_typer(eval_app, name="eval", help="Benchmark runs (LoCoMo, LongMemEval) and their reports.")


_mount_subcommands()
