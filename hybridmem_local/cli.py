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

from hybridmem_local.cli_errors import err, fail, reported
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


# --------------------------------------------------------------------------- service: serve


@app.command()
def serve(
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
    host: Optional[str] = typer.Option(None, "--host", help="Address to bind (default service.host: 127.0.0.1). A wider one is a deliberate choice."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="Port (default service.port: 8420)."),
    no_auth: bool = typer.Option(False, "--no-auth", help="Accept requests without an API key (loopback addresses only)."),
    overrides: Optional[list[str]] = typer.Option(None, "--set", help="Config override KEY=VALUE (dotted key, YAML value), repeatable."),
) -> None:
    """Run the HTTP API (and the MCP server at /mcp) over the store, with the curation worker."""
    from hybridmem_local.cli_eval import _overrides
    from hybridmem_local.service.limits import is_loopback

    with reported(*USER_ERRORS):
        cfg = load_config(config, _overrides(overrides))
    bind = host or cfg.service.host
    if no_auth and not is_loopback(bind):
        raise fail(
            f"--no-auth would let anyone who reaches {bind} read and change every namespace; "
            "it is allowed only on a loopback address (127.0.0.1, ::1, localhost). Create a key with `hybridmem keys create`."
        )
    import uvicorn

    from hybridmem_local.service.app import create_app
    from hybridmem_local.service.state import ServiceState

    with reported(*USER_ERRORS):
        state = ServiceState(db, cfg)
        state.open()
    try:
        if not no_auth and not state.keys.list():
            err.print("[yellow]warning:[/] the store has no API keys yet; every request will get 401. "
                      "Create one with `hybridmem keys create --namespace NS --role write`.")
        service = create_app(state, require_auth=not no_auth)
        _close_on_shutdown(service, state)
        # The service logs its own access lines (no turn text, no keys); uvicorn's would show query strings.
        logging.getLogger("hybridmem_local.service.access").setLevel(logging.INFO)
        uvicorn.run(service, host=bind, port=port or cfg.service.port, access_log=False, log_level="info")
    finally:
        state.close()  # a no-op after a clean shutdown; covers a failed start (port in use)


def _close_on_shutdown(service, state) -> None:
    """Close the state (worker stopped, indexes saved, stores closed) in the app's shutdown: after
    a SIGTERM, uvicorn re-raises the signal once it has shut down, so code after ``uvicorn.run``
    would never run."""
    from contextlib import asynccontextmanager

    inner = service.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app):
        async with inner(app) as app_state:
            yield app_state
        state.close()

    service.router.lifespan_context = lifespan


# --------------------------------------------------------------------------- service: API keys

keys_app = typer.Typer(help="API keys of `hybridmem serve`: create, list, revoke.", no_args_is_help=True, add_completion=False)
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(
    namespace: list[str] = typer.Option(..., "--namespace", "-n", help="Namespace the key reaches (repeatable; '*' for all)."),
    role: str = typer.Option(..., "--role", help="read, write or admin (each includes the ones before)."),
    label: Optional[str] = typer.Option(None, "--label", help="A note saying whose key this is."),
    db: Path = DB_OPTION,
) -> None:
    """Create a key; it is printed once and only its salted hash is kept."""
    from hybridmem_local.service.keys import KeyRing
    from hybridmem_local.store import MemoryStore

    with reported(*USER_ERRORS):
        store = MemoryStore(db)
        try:
            key, token = KeyRing(store).create(namespace, role, label)
        finally:
            store.close()
    console.print(f"created key {key.key_id} ({key.role.value} on {', '.join(key.namespaces)}); it is shown only now:")
    print(token)


@keys_app.command("list")
def keys_list(db: Path = DB_OPTION, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Every key with its role, namespaces and whether it is revoked (never the secret)."""
    from hybridmem_local.service.keys import KeyRing
    from hybridmem_local.store import MemoryStore

    with reported(*USER_ERRORS):
        store = MemoryStore(db)
        try:
            keys = KeyRing(store).list()
        finally:
            store.close()
    if as_json:
        console.print_json(json.dumps([json.loads(k.model_dump_json()) for k in keys]))
        return
    table = Table("key id", "role", "namespaces", "label", "created", "revoked")
    for key in keys:
        table.add_row(key.key_id, key.role.value, ",".join(key.namespaces), key.label or "",
                      key.created_at.isoformat(timespec="seconds"), key.revoked_at.isoformat(timespec="seconds") if key.revoked_at else "")
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="The key id (the 8 hex characters after hm_)."), db: Path = DB_OPTION) -> None:
    """Revoke a key: a running server refuses it from its next request on."""
    from hybridmem_local.service.keys import KeyRing
    from hybridmem_local.store import MemoryStore

    with reported(*USER_ERRORS):
        store = MemoryStore(db)
        try:
            key = KeyRing(store).revoke(key_id)
        finally:
            store.close()
    console.print(f"revoked key {key.key_id} at {key.revoked_at.isoformat(timespec='seconds')}")


# --------------------------------------------------------------------------- service: MCP over stdio


@app.command("mcp")
def mcp_stdio(
    namespace: str = typer.Option(..., "--namespace", "-n", help="The one namespace every tool acts on."),
    db: Path = DB_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
    overrides: Optional[list[str]] = typer.Option(None, "--set", help="Config override KEY=VALUE (dotted key, YAML value), repeatable."),
) -> None:
    """Serve the MCP tools over stdio for a local agent (no key: the namespace is fixed here), with the curation worker."""
    from hybridmem_local.cli_eval import _overrides
    from hybridmem_local.schema import check_namespace
    from hybridmem_local.service.mcp_server import run_stdio
    from hybridmem_local.service.state import ServiceState
    from hybridmem_local.store import MemoryStore

    with reported(*USER_ERRORS):
        cfg = load_config(config, _overrides(overrides))
        check_namespace(namespace)
        # The state opens once the MCP session runs (stdout is the wire by then): refuse a store
        # that cannot open here, as one line, rather than as a failed session.
        MemoryStore(db, busy_timeout_ms=cfg.store.busy_timeout_ms).close()
    run_stdio(ServiceState(db, cfg), namespace)


def _mount_subcommands() -> None:
    from hybridmem_local.cli_models import app as models_app

    app.add_typer(models_app, name="models", help="Model manifest: list, verify, download, bundle, install-bundle.")
    from hybridmem_local.cli_eval import app as eval_app
    app.add_typer(eval_app, name="eval", help="Benchmark runs (LoCoMo, LongMemEval) and their reports.")


_mount_subcommands()


def main() -> None:  # pragma: no cover - console entry
    app()
