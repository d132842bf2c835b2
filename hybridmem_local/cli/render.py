"""How the library's results look in a terminal: rich tables, answers, progress bars.

Rendering lives here, in the CLI, only: the library returns data (pydantic models) and
``--json`` prints that data as it is; these are the table forms of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from hybridmem_local.cli.common import print_data, print_json
from hybridmem_local.cli.console import console, err

if TYPE_CHECKING:
    from hybridmem_local.results import (
        Answer,
        ConsolidationReport,
        IngestReport,
        SearchResult,
        SessionRecord,
        WindowHit,
    )
    from hybridmem_local.schema import Episode, RelationalTuple

#: The columns a memory is shown with in tables.
MEMORY_COLUMNS = ("id", "kind", "status", "timestamp", "memory", "turns", "provenance")


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


def curation_notes(report: IngestReport) -> str:
    """What the write-time checks did to the curated memories, when they did anything."""
    # What the checks left out is normal operation, not a fault: a count here, each memory with its
    # reason in the --verbose log (curation/curator.py).
    notes = [f"{report.memories_left_out} left out by the checks (-v lists them)"] if report.memories_left_out else []
    notes += [f"{report.duplicates_skipped} repeats not stored again"] if report.duplicates_skipped else []
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


def print_session(record: SessionRecord) -> None:
    """A stored session: its curation status in the title, then one row per turn."""
    session = record.session
    status = record.curation_status + (f" ({record.curation_error})" if record.curation_error else "")
    table = Table(
        "turn",
        "speaker",
        "text",
        title=f"session {session.session_id} ({session.namespace}, {session.started_at}): {status}",
    )
    for turn in session.turns:
        table.add_row(turn.turn_id, turn.speaker, turn.text)
    console.print(table)


def print_search(result: SearchResult) -> None:
    """The memories found, then the windows of raw turns (when windows are a retrieval source)."""
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


def print_answer(answer: Answer) -> None:
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


def consolidation_table(report: ConsolidationReport) -> Table:
    """A consolidation run (or dry run): one row per store and a total; timings in the caption."""
    title = "Consolidation plan (dry run)" if report.dry_run else f"Consolidation run {report.run_id}"
    t = report.timings
    table = Table(
        title=f"{title} · namespace {report.namespace} · clustering {report.backend or '-'}",
        caption=(
            f"embeddings {t.embed_load_s:.1f}s · UMAP {t.umap_s:.1f}s · HDBSCAN {t.hdbscan_s:.1f}s · "
            f"LLM {t.llm_s:.1f}s ({report.llm.requests} requests, {report.llm.cached} cached) · apply {t.apply_s:.2f}s"
        ),
    )
    for column in (
        "store",
        "before",
        "after",
        "compression",
        "clusters",
        "noise",
        "LLM calls",
        "merges",
        "deletions",
        "plans skipped",
    ):
        table.add_column(column, justify="left" if column == "store" else "right")
    for kind, s in report.stores.items():
        table.add_row(
            f"{kind}s",
            str(s.memories_before),
            str(s.memories_after),
            f"{s.compression_pct:.1f}%",
            str(s.clusters),
            str(s.noise),
            str(s.llm_calls),
            str(s.merges),
            str(s.deletions),
            str(s.invalid_plans_skipped),
        )
    stores = report.stores.values()
    table.add_row(
        "total",
        str(report.memories_before),
        str(report.memories_after),
        f"{report.compression_pct:.1f}%",
        *(
            str(sum(getattr(s, f) for s in stores))
            for f in ("clusters", "noise", "llm_calls", "merges", "deletions", "invalid_plans_skipped")
        ),
        style="bold",
    )
    return table
