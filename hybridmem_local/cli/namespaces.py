"""Whole namespaces and the store: ``stats``, ``export``, ``import``, ``forget``,
``rebuild-indexes``, ``backup`` (``HybridMemory.stats``, ``export``, ``import_``, ``forget``,
``rebuild_indexes``, ``backup``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hybridmem_local.cli.common import (
    Namespace,
    NamespaceFilter,
    Output,
    StoreOptions,
    print_data,
    print_json,
    with_options,
)
from hybridmem_local.cli.console import console


@with_options
def stats(namespace: NamespaceFilter = None, *, store: StoreOptions, output: Output) -> None:
    """Counts of sessions, turns and memories by status."""
    with store.open_memory() as memory:
        output.show(memory.stats(namespace))


@with_options
def export(
    out: Annotated[Path, typer.Argument(help="JSONL file to write.")],
    namespace: Namespace = "default",
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Export a namespace (sessions and memories with provenance) as JSONL."""
    with store.open_memory() as memory:
        records = memory.export(namespace, out)
    if output.as_json:
        print_json({"records": records, "path": str(out)})
    else:
        console.print(f"wrote {records} records to {out}")


@with_options
def import_(
    path: Annotated[Path, typer.Argument(help="JSONL written by `hybridmem export`; - reads stdin.")],
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Import into this namespace instead.")
    ] = None,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Import a namespace export."""
    with store.open_memory() as memory:
        output.show(memory.import_(path, namespace))


@with_options
def forget(
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="The namespace to remove.")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Remove every trace of a namespace (rows, history, vectors, index files, exports, LLM cache)."""
    if not yes and not typer.confirm(f"Permanently remove namespace {namespace!r}?"):
        raise typer.Exit(code=1)
    with store.open_memory() as memory:
        output.show(memory.forget(namespace))


@with_options
def rebuild_indexes(namespace: Namespace = "default", *, store: StoreOptions, output: Output) -> None:
    """Throw the namespace's index files away and build them again from the store (they are a cache)."""
    with store.open_memory() as memory:
        reports = memory.rebuild_indexes(namespace)
    if output.as_json:
        print_json(reports)
    else:
        print_data([{"index": name, **report.model_dump()} for name, report in reports.items()], False)


@with_options
def backup(
    out: Annotated[Path, typer.Argument(help="File to write the copy to (replaced if it exists).")],
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """A consistent copy of the whole store, safe while the service writes (encrypted with the
    store's key when it is); its indexes rebuild from it when it is opened."""
    out.unlink(missing_ok=True)
    with store.open_memory() as memory:
        memory.backup(out)
    if output.as_json:
        print_json({"backup": str(out), "bytes": out.stat().st_size})
    else:
        console.print(f"backed up the store to {out} ({out.stat().st_size:,} bytes)")
