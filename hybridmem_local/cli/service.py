"""The service commands of ``hybridmem`` (mounted by ``cli/main.py``): ``serve`` (HTTP API and MCP),
``mcp`` (MCP over stdio) and ``keys`` (the service's API keys)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from rich.table import Table

from hybridmem_local.cli.common import USER_ERRORS, Output, StoreOptions, print_json, with_options
from hybridmem_local.cli.console import console, err
from hybridmem_local.cli.errors import fail, reported

# --------------------------------------------------------------------------- service: serve


@with_options
def serve(
    host: Annotated[
        str | None,
        typer.Option(
            "--host", help="Address to bind (default service.host: 127.0.0.1). A wider one is a deliberate choice."
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", min=1, max=65535, help="Port (default service.port: 8420).")
    ] = None,
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="Accept requests without an API key (loopback addresses only).")
    ] = False,
    no_worker: Annotated[
        bool,
        typer.Option(
            "--no-worker", help="Serve requests only; `hybridmem worker` processes curate (a replica of several)."
        ),
    ] = False,
    *,
    store: StoreOptions,
) -> None:
    """Run the HTTP API (and the MCP server at /mcp) over the store, with the curation worker."""
    from hybridmem_local.service.limits import is_loopback

    cfg = store.config
    bind = host or cfg.service.host
    if no_auth and not is_loopback(bind):
        raise fail(
            f"--no-auth would let anyone who reaches {bind} read and change every namespace; "
            "it is allowed only on a loopback address (127.0.0.1, ::1, localhost). Create a key with `hybridmem keys "
            "create`."
        )
    import uvicorn

    from hybridmem_local.service.app import create_app
    from hybridmem_local.service.state import ServiceState

    with reported(*USER_ERRORS):
        state = ServiceState(store.db, cfg, start_worker=not no_worker)
        state.open()
    try:
        if not no_auth and not state.keys.list():
            err.print(
                "[yellow]warning:[/] the store has no API keys yet; every request will get 401. "
                "Create one with `hybridmem keys create --namespace NS --role write`."
            )
        service = create_app(state, require_auth=not no_auth)
        _close_on_shutdown(service, state)
        # The service logs its own access lines (no turn text, no keys); uvicorn's would show query strings.
        logging.getLogger("hybridmem_local.service.access").setLevel(logging.INFO)
        uvicorn.run(service, host=bind, port=port or cfg.service.port, access_log=False, log_level="info")
    finally:
        state.close()  # a no-op after a clean shutdown; covers a failed start (port in use)


@with_options
def worker(*, store: StoreOptions) -> None:
    """Curate the store's pending sessions until stopped (SIGTERM or Ctrl-C), beside any number of
    other workers and `serve` replicas on the same store: each claims its own batches."""
    import signal
    import threading

    from hybridmem_local.embedding import build_embedder
    from hybridmem_local.llm.factory import store_llm
    from hybridmem_local.service.worker import CurationWorker
    from hybridmem_local.storage.encryption import load_keys

    cfg = store.config
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with reported(*USER_ERRORS):
        with store.open_store() as opened:  # where the store's LLM cache lives on this host
            files_base = opened.path
        llm = store_llm(cfg.llm, files_base, load_keys(cfg.store))
        curation = CurationWorker(store.db, cfg, build_embedder(cfg.embedder), llm)
    logging.getLogger("hybridmem_local.service.worker").setLevel(logging.INFO)
    err.print(f"worker {curation.name} curating {'the PostgreSQL store' if cfg.store.url else store.db}")
    curation.start()
    try:
        while not stop.wait(1.0) and curation.alive:
            pass
    except KeyboardInterrupt:
        pass
    finally:
        if curation.close():
            llm.close()  # else an abandoned LLM call may still return into it


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

keys_app = typer.Typer(
    help="API keys of `hybridmem serve`: create, list, revoke.", no_args_is_help=True, add_completion=False
)


@keys_app.command("create")
@with_options
def keys_create(
    namespace: Annotated[
        list[str], typer.Option("--namespace", "-n", help="Namespace the key reaches (repeatable; '*' for all).")
    ],
    role: Annotated[str, typer.Option("--role", help="read, write or admin (each includes the ones before).")],
    label: Annotated[str | None, typer.Option("--label", help="A note saying whose key this is.")] = None,
    *,
    store: StoreOptions,
) -> None:
    """Create a key; it is printed once and only its salted hash is kept."""
    from hybridmem_local.service.keys import KeyRing

    with store.open_store() as opened:
        key, token = KeyRing(opened).create(namespace, role, label)
    console.print(f"created key {key.key_id} ({key.role.value} on {', '.join(key.namespaces)}); it is shown only now:")
    print(token)


@keys_app.command("list")
@with_options
def keys_list(*, store: StoreOptions, output: Output) -> None:
    """Every key with its role, namespaces and whether it is revoked (never the secret)."""
    from hybridmem_local.service.keys import KeyRing

    with store.open_store() as opened:
        keys = KeyRing(opened).list()
    if output.as_json:
        print_json(keys)
        return
    table = Table("key id", "role", "namespaces", "label", "created", "revoked")
    for key in keys:
        table.add_row(
            key.key_id,
            key.role.value,
            ",".join(key.namespaces),
            key.label or "",
            key.created_at.isoformat(timespec="seconds"),
            key.revoked_at.isoformat(timespec="seconds") if key.revoked_at else "",
        )
    console.print(table)


@keys_app.command("revoke")
@with_options
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key id (the 8 hex characters after hm_).")],
    *,
    store: StoreOptions,
) -> None:
    """Revoke a key: a running server refuses it from its next request on."""
    from hybridmem_local.service.keys import KeyRing

    with store.open_store() as opened:
        key = KeyRing(opened).revoke(key_id)
    at = f" at {key.revoked_at.isoformat(timespec='seconds')}" if key.revoked_at is not None else ""
    console.print(f"revoked key {key.key_id}{at}")


# --------------------------------------------------------------------------- service: MCP over stdio


@with_options
def mcp(
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="The one namespace every tool acts on.")],
    *,
    store: StoreOptions,
) -> None:
    """Serve the MCP tools over stdio for a local agent, on one namespace (no key), with the curation worker."""
    from hybridmem_local.schema import check_namespace
    from hybridmem_local.service.mcp_server import run_stdio
    from hybridmem_local.service.state import ServiceState
    from hybridmem_local.storage.store import MemoryStore

    cfg = store.config
    with reported(*USER_ERRORS):
        check_namespace(namespace)
        # The state opens once the MCP session runs (stdout is the wire by then): refuse a store
        # that cannot open here, as one line, rather than as a failed session.
        MemoryStore.open(store.db, cfg.store).close()
    run_stdio(ServiceState(store.db, cfg), namespace)
