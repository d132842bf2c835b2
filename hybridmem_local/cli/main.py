"""The ``hybridmem`` command: the Typer app, the commands of the embedded default (``demo``,
``doctor``) and the mounting of the others, one module per job.

The CLI is the Python API with flags: each operation of
:class:`~hybridmem_local.memory.HybridMemory` a user would call has a command (docs/cli.md maps
them, and lists the methods left out with why). Every command that prints data takes ``--json``;
every command that reads the config takes ``--set KEY=VALUE``; ``-`` reads standard input where
a file is read (``ingest``, ``add``, ``add-memories``, ``import``, ``--config``). The shared
options are declared once, in the bundles of ``cli/common.py``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated

import typer

from hybridmem_local.cli.common import USER_ERRORS, ConfigOptions, Output, print_json, with_options
from hybridmem_local.cli.console import console
from hybridmem_local.cli.errors import reported
from hybridmem_local.cli.render import curation_notes, print_answer, progress
from hybridmem_local.files.session_files import read_sessions_jsonl

app = typer.Typer(help="Offline long-term memory for dialogue agents.", no_args_is_help=True, add_completion=False)

DEMO_SESSIONS = Path(__file__).parent.parent / "examples" / "demo_sessions.jsonl"
DEMO_QUESTIONS = ["How long did Bob need for the Riverside 10K?", "What is the name of Alice's puppy?"]


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what each stage does.")] = False) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


@with_options
def demo(
    db: Annotated[Path, typer.Option("--db", help="Where the demo store goes.")] = Path("runs/demo/memory.db"),
    question: Annotated[list[str], typer.Option("--question", "-q")] = DEMO_QUESTIONS,
    *,
    options: ConfigOptions,
) -> None:
    """The main job on the embedded default, offline: ingest + curate a small conversation, then answer."""
    from hybridmem_local.cli.doctor import require_models
    from hybridmem_local.memory import HybridMemory

    started = time.perf_counter()
    settings = options.config
    with reported(*USER_ERRORS):
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


@with_options
def doctor(
    verify: Annotated[bool, typer.Option("--verify", help="Also recompute model checksums.")] = False,
    *,
    options: ConfigOptions,
    output: Output,
) -> None:
    """Resolved models, backends (CPU/GPU, cuML, vLLM), the config in force, offline mode."""
    from hybridmem_local.cli.doctor import doctor_report, print_doctor

    config_file = options.config_file
    report = doctor_report(options.config, verify=verify, source=str(config_file) if config_file else None)
    if output.as_json:
        print_json(report)
    else:
        print_doctor(report, console)


def _mount_commands() -> None:
    """Every command, from the module of its job, listed by ``--help`` under that job in this
    order. A command's name is its function's, dashed, less a trailing ``_`` (``list_``: ``list``)."""
    from hybridmem_local.cli import (
        audit,
        consolidation,
        encryption,
        memories,
        namespaces,
        redactions,
        service,
        sessions,
    )
    from hybridmem_local.cli.eval import app as eval_app
    from hybridmem_local.cli.models import app as models_app

    jobs = {
        "Sessions": [
            sessions.ingest,
            sessions.add,
            sessions.remember,
            sessions.add_messages,
            sessions.curate,
            sessions.sessions,
            sessions.get_session,
        ],
        "Memories": [
            memories.get,
            memories.list_,
            memories.add_memories,
            memories.update,
            memories.delete,
            memories.history,
            memories.search,
            memories.ask,
        ],
        "Namespaces": [namespaces.stats, namespaces.export, namespaces.import_, namespaces.forget],
        "Maintenance": [
            namespaces.rebuild_indexes,
            namespaces.backup,
            consolidation.consolidate,
            consolidation.undo,
            consolidation.purge,
        ],
        "Setup": [demo, doctor],
        "Service": [service.serve, service.worker, service.mcp],
        "Store": [encryption.encrypt],
    }
    for job, commands in jobs.items():
        for command in commands:
            app.command(command.__name__.removesuffix("_").replace("_", "-"), rich_help_panel=job)(command)
    groups = [
        ("redactions", redactions.app, "Maintenance"),
        ("keys", service.keys_app, "Service"),
        ("master-key", encryption.master_key_app, "Store"),
        ("audit", audit.app, "Store"),
    ]
    for name, group, job in groups:
        app.add_typer(group, name=name, rich_help_panel=job)
    app.add_typer(
        models_app,
        name="models",
        rich_help_panel="Setup",
        help="Model manifest: list, verify, download, bundle, install-bundle.",
    )
    app.add_typer(
        eval_app,
        name="eval",
        rich_help_panel="Evaluation",
        help="Benchmark runs (LoCoMo, LongMemEval) and their reports.",
    )


_mount_commands()
