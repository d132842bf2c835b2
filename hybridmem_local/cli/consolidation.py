"""Consolidation runs: ``consolidate``, ``undo``, ``purge`` (the ``HybridMemory`` methods of the
same names)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer

from hybridmem_local.cli.common import Namespace, Output, StoreOptions, print_json, with_options
from hybridmem_local.cli.console import console
from hybridmem_local.cli.render import consolidation_table


@with_options
def consolidate(
    namespace: Namespace = "default",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the clusters and the plan; change nothing.")] = False,
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Cluster memories (UMAP → HDBSCAN) and merge/delete them with the LLM, as one undoable run."""
    with store.open_memory() as memory:
        report = memory.consolidate(namespace, dry_run=dry_run)
    if output.as_json:
        print_json(report)
    else:
        console.print(consolidation_table(report))


@with_options
def undo(
    run_id: Annotated[int, typer.Argument(help="A consolidation run id (see `hybridmem consolidate`).")],
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Restore exactly the state before a consolidation run."""
    with store.open_memory() as memory:
        output.show(memory.undo(run_id))


@with_options
def purge(
    older_than_days: Annotated[
        float, typer.Option("--older-than", help="Days since a memory was superseded or deleted.")
    ],
    namespace: Namespace = "default",
    *,
    store: StoreOptions,
    output: Output,
) -> None:
    """Physically remove memories retired longer ago than --older-than days (with their history)."""
    with store.open_memory() as memory:
        output.show(memory.purge(namespace, timedelta(days=older_than_days)))
