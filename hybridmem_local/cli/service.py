"""The service commands of ``hybridmem`` (mounted by ``cli/main.py``): ``serve`` (HTTP API and MCP),
``mcp`` (MCP over stdio) and ``keys`` (the service's API keys)."""

from __future__ import annotations

import logging
from pathlib import Path

import typer
from rich.table import Table

from hybridmem_local.cli.common import (
    CONFIG_OPTION,
    DB_OPTION,
    JSON_OPTION,
    SET_OPTION,
    USER_ERRORS,
    config_from,
    console,
    print_json,
)
from hybridmem_local.cli.errors import err, fail, reported

# --------------------------------------------------------------------------- service: serve


def serve(
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    host: str | None = typer.Option(
        None, "--host", help="Address to bind (default service.host: 127.0.0.1). A wider one is a deliberate choice."
    ),
    port: int | None = typer.Option(None, "--port", min=1, max=65535, help="Port (default service.port: 8420)."),
    no_auth: bool = typer.Option(
        False, "--no-auth", help="Accept requests without an API key (loopback addresses only)."
    ),
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Run the HTTP API (and the MCP server at /mcp) over the store, with the curation worker."""
    from hybridmem_local.service.limits import is_loopback

    with reported(*USER_ERRORS):
        cfg = config_from(config, overrides)
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
        state = ServiceState(db, cfg)
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
def keys_create(
    namespace: list[str] = typer.Option(
        ..., "--namespace", "-n", help="Namespace the key reaches (repeatable; '*' for all)."
    ),
    role: str = typer.Option(..., "--role", help="read, write or admin (each includes the ones before)."),
    label: str | None = typer.Option(None, "--label", help="A note saying whose key this is."),
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Create a key; it is printed once and only its salted hash is kept."""
    from hybridmem_local.service.keys import KeyRing
    from hybridmem_local.storage.store import MemoryStore

    with reported(*USER_ERRORS):
        store = MemoryStore.open(db, config_from(config, overrides).store)
        try:
            key, token = KeyRing(store).create(namespace, role, label)
        finally:
            store.close()
    console.print(f"created key {key.key_id} ({key.role.value} on {', '.join(key.namespaces)}); it is shown only now:")
    print(token)


@keys_app.command("list")
def keys_list(
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Every key with its role, namespaces and whether it is revoked (never the secret)."""
    from hybridmem_local.service.keys import KeyRing
    from hybridmem_local.storage.store import MemoryStore

    with reported(*USER_ERRORS):
        store = MemoryStore.open(db, config_from(config, overrides).store)
        try:
            keys = KeyRing(store).list()
        finally:
            store.close()
    if as_json:
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
def keys_revoke(
    key_id: str = typer.Argument(..., help="The key id (the 8 hex characters after hm_)."),
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Revoke a key: a running server refuses it from its next request on."""
    from hybridmem_local.service.keys import KeyRing
    from hybridmem_local.storage.store import MemoryStore

    with reported(*USER_ERRORS):
        store = MemoryStore.open(db, config_from(config, overrides).store)
        try:
            key = KeyRing(store).revoke(key_id)
        finally:
            store.close()
    at = f" at {key.revoked_at.isoformat(timespec='seconds')}" if key.revoked_at is not None else ""
    console.print(f"revoked key {key.key_id}{at}")


# --------------------------------------------------------------------------- service: MCP over stdio


def mcp_stdio(
    namespace: str = typer.Option(..., "--namespace", "-n", help="The one namespace every tool acts on."),
    db: Path = DB_OPTION,
    config: Path | None = CONFIG_OPTION,
    overrides: list[str] | None = SET_OPTION,
) -> None:
    """Serve the MCP tools over stdio for a local agent (no key: the namespace is fixed here), with the curation "
    "worker."""
    from hybridmem_local.schema import check_namespace
    from hybridmem_local.service.mcp_server import run_stdio
    from hybridmem_local.service.state import ServiceState
    from hybridmem_local.storage.store import MemoryStore

    with reported(*USER_ERRORS):
        cfg = config_from(config, overrides)
        check_namespace(namespace)
        # The state opens once the MCP session runs (stdout is the wire by then): refuse a store
        # that cannot open here, as one line, rather than as a failed session.
        MemoryStore.open(db, cfg.store).close()
    run_stdio(ServiceState(db, cfg), namespace)
