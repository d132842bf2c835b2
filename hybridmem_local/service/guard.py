"""The Guard of ``hybridmem serve``: size limit, API key, rate limit and one audit entry per
request for ``/v1`` and ``/mcp`` (``app.py`` explains the order), and the console's guard
builds on it (``hybridmem_local/console/guard.py``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

import anyio

from hybridmem_local.errors import (
    BadRequestError,
    InvalidInputError,
    PayloadTooLargeError,
    RateLimitedError,
    UnauthorizedError,
)
from hybridmem_local.schema import check_namespace
from hybridmem_local.service.errors import error_response
from hybridmem_local.service.keys import ALL_NAMESPACES, ApiKey, Role
from hybridmem_local.service.limits import RateLimiter, read_body
from hybridmem_local.service.state import ServiceState
from hybridmem_local.storage import audit

log = logging.getLogger(__name__)
access_log = logging.getLogger("hybridmem_local.service.access")

#: The key every request acts with under ``--no-auth`` (loopback only): an admin of everything.
NO_AUTH_KEY = ApiKey(key_id="no-auth", role=Role.admin, namespaces=[ALL_NAMESPACES], created_at=datetime(2000, 1, 1))


# --------------------------------------------------------------------------- the guard (ASGI middleware)


class Guard:
    """Size limit, authentication and rate limit for ``/v1`` and ``/mcp``; an access log line for all.

    A pure ASGI middleware rather than a FastAPI dependency, so that a request without a valid
    key is refused before its body is read or parsed, and the MCP app mounted at ``/mcp`` gets
    the same checks (it finds the key in ``scope["state"]["api_key"]``).
    """

    PROTECTED = ("/v1", "/mcp")

    def __init__(self, app: Callable, state: ServiceState, require_auth: bool):
        self.app = app
        self.state = state
        self.require_auth = require_auth
        service = state.config.service
        self.max_body = service.max_body_bytes
        self.log_content = service.log_content
        self.limiter = RateLimiter(service.rate_limit_per_s, service.rate_limit_burst)
        self.audit_enabled = state.config.audit.enabled

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: list[int] = []

        async def send_logged(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            if scope["path"].startswith(self.PROTECTED):
                await self._guarded(scope, receive, send_logged)
            else:
                await self.app(scope, receive, send_logged)
        finally:
            key = scope.get("state", {}).get("api_key")
            route = scope.get("route")
            access_log.info(
                "%s %s %s key=%s %.1fms%s",
                scope["method"],
                getattr(route, "path", None) or _unrouted(scope["path"]),
                status[0] if status else "-",
                key.key_id if key is not None else "-",
                (time.perf_counter() - started) * 1000,
                f" query={scope.get('query_string', b'').decode('latin-1')!r}" if self.log_content else "",
            )

    async def _guarded(self, scope: dict, receive: Callable, send: Callable) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            # Refused unread: a client must not make the server take in what it will not accept.
            await error_response(
                PayloadTooLargeError(
                    f"request body of {int(declared)} bytes is over the limit of {self.max_body} bytes "
                    "(service.max_body_bytes)"
                )
            )(scope, receive, send)
            return
        key = await self._authenticate(headers.get("authorization"))
        if isinstance(key, str):
            await error_response(UnauthorizedError(key))(scope, receive, send)
            return
        scope.setdefault("state", {})["api_key"] = key
        wait = self.limiter.take(key.key_id)
        if wait is not None:
            # Not an audit entry: a key flooding the service must not flood the store too.
            await error_response(
                RateLimitedError(
                    f"API key {key.key_id} is over its rate limit of {self.limiter.rate:g} requests/s "
                    f"(burst {self.limiter.burst}); retry in {wait:.2f}s",
                    retry_after=wait,
                )
            )(scope, receive, send)
            return
        if not self.audit_enabled:
            await self._read_and_run(scope, receive, send)
            return
        # One audit entry per authenticated request, with the key id and the route; the facade
        # calls the route makes add their ids to it instead of writing entries of their own.
        entry = audit.AuditScope(actor=key.key_id, action=None)
        token = audit.SCOPE.set(entry)
        try:
            await self._read_and_run(scope, receive, _recording(entry, scope, send, self.state))
        finally:
            audit.SCOPE.reset(token)
            if not entry.recorded:  # no response started (the client went away)
                with anyio.CancelScope(shield=True):
                    await _record(entry, scope, self.state, None)

    async def _read_and_run(self, scope: dict, receive: Callable, send: Callable) -> None:
        """The body read with the size limit and checked to be UTF-8, then the app."""
        try:
            body = await read_body(receive, self.max_body)
        except PayloadTooLargeError as exc:
            await error_response(exc)(scope, receive, send)
            return
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            await error_response(BadRequestError(f"request body is not valid UTF-8 (byte {exc.start}: {exc.reason})"))(
                scope, receive, send
            )
            return
        await self.app(scope, _replay(body, receive), send)

    async def _authenticate(self, header: str | None) -> ApiKey | str:
        """The request's key, or a message saying why there is none."""
        if not self.require_auth:
            return NO_AUTH_KEY
        if header is None:
            return "missing Authorization header; send 'Authorization: Bearer <key>'"
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return "Authorization header must be 'Bearer <key>'"
        # The key lookup reads SQLite: off the event loop, so a slow disk stalls no other request.
        key = await anyio.to_thread.run_sync(self.state.keys.authenticate, token)
        return key if key is not None else "invalid or revoked API key"


def _recording(entry: audit.AuditScope, scope: dict, send: Callable, state: ServiceState) -> Callable:
    """A ``send`` that queues the request's audit entry as its response starts (the route has
    run by then, and the status says how it ended)."""

    async def send_recorded(message: dict) -> None:
        if message["type"] == "http.response.start" and not entry.recorded:
            await _record(entry, scope, state, message["status"])
        await send(message)

    return send_recorded


async def _record(entry: audit.AuditScope, scope: dict, state: ServiceState, status: int | None) -> None:
    route = scope.get("route")
    if entry.action is None:  # the MCP server names the tool it ran
        entry.action = f"{scope['method']} {getattr(route, 'path', None) or _unrouted(scope['path'])}"
    named = scope.get("path_params", {}).get("namespace")
    if not any(ns is not None for ns in entry.refs) and isinstance(named, str) and _valid_namespace(named):
        entry.note(named)  # refused before the operations resolved it: still the namespace asked for
    if status is None:
        entry.fail("no_response")
    elif status >= 400:
        entry.fail(f"http_{status}")  # kept only when no error code was noted already
    entry.recorded = True
    # Before the response starts, so the entry is stored when the client has its answer; off
    # the event loop, as it writes SQLite.
    await anyio.to_thread.run_sync(state.record_audit, entry)


def _valid_namespace(name: str) -> bool:
    try:
        check_namespace(name)
    except InvalidInputError:
        return False
    return True


def _unrouted(path: str) -> str:
    """The path logged for a request no route matched: only its first segment (it may hold text)."""
    return "/" + path.lstrip("/").split("/", 1)[0] + ("/…" if path.count("/") > 1 else "")


def _replay(body: bytes, receive: Callable) -> Callable:
    """A ``receive`` that hands the app the body already read, then defers to the client's."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
