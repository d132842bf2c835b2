"""Browser sessions of the console and the middleware that turns one into the request's API key.

A session is a random id in a cookie, mapped here (in memory) to the key's id and a CSRF token;
:class:`ConsoleGuard` is the service's ``Guard`` with that cookie in place of the bearer header
(same rate limit, body limit and audit entry per request).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.cookies import SimpleCookie

import anyio

from hybridmem_local.errors import NotFoundError, RateLimitedError
from hybridmem_local.service.errors import error_response
from hybridmem_local.service.guard import NO_AUTH_KEY, Guard, _record
from hybridmem_local.service.keys import ApiKey
from hybridmem_local.service.state import ServiceState
from hybridmem_local.storage import audit

#: The session cookie, and the sign-in form's double-submit cookie.
COOKIE = "hm_console"
SIGN_IN_COOKIE = "hm_console_sign_in"
#: A session unused this long ends (seconds).
IDLE_S = 8 * 3600
#: Where the console is mounted (the audit action and the cookies' Path).
PREFIX = "/console"


@dataclass
class BrowserSession:
    key_id: str
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    last_seen: float = field(default_factory=time.monotonic)

    def csrf_ok(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.csrf.encode())


class BrowserSessions:
    """Session id → :class:`BrowserSession`, in this process's memory only."""

    def __init__(self, idle_s: float = IDLE_S):
        self.idle_s = idle_s
        self._sessions: dict[str, BrowserSession] = {}
        self._lock = threading.Lock()

    def open(self, key_id: str) -> tuple[str, BrowserSession]:
        session_id = secrets.token_urlsafe(32)
        session = BrowserSession(key_id)
        with self._lock:
            now = time.monotonic()
            self._sessions = {k: s for k, s in self._sessions.items() if now - s.last_seen < self.idle_s}
            self._sessions[session_id] = session
        return session_id, session

    def get(self, session_id: str | None) -> BrowserSession | None:
        if not session_id:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            now = time.monotonic()
            if now - session.last_seen >= self.idle_s:
                del self._sessions[session_id]
                return None
            session.last_seen = now
            return session

    def close(self, session_id: str | None) -> None:
        with self._lock:
            self._sessions.pop(session_id or "", None)


def cookies(scope: dict) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # noqa: BLE001 - a malformed cookie header is no session
                return {}
    return {name: morsel.value for name, morsel in jar.items()}


class ConsoleGuard(Guard):
    """The session cookie → the request's key (``scope["state"]["api_key"]``, None without a valid
    session); then, for a signed-in request, the Guard's rate limit, body limit and audit entry."""

    def __init__(self, app: Callable, state: ServiceState, require_auth: bool, sessions: BrowserSessions):
        super().__init__(app, state, require_auth)
        self.sessions = sessions

    def _key(self, key_id: str) -> ApiKey | None:
        if key_id == NO_AUTH_KEY.key_id:
            return None if self.require_auth else NO_AUTH_KEY
        try:
            key = self.state.keys.get(key_id)
        except NotFoundError:
            return None
        return key if key.revoked_at is None else None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session_id = cookies(scope).get(COOKIE)
        session = self.sessions.get(session_id)
        key = await anyio.to_thread.run_sync(self._key, session.key_id) if session is not None else None
        if session is not None and key is None:  # revoked or deleted since sign-in: the session ends
            self.sessions.close(session_id)
            session = None
        state = scope.setdefault("state", {})
        state["console_session"], state["console_session_id"], state["api_key"] = session, session_id, key
        if key is None:  # sign-in page, static files, or a page that will send the browser to sign in
            await self._read_and_run(scope, receive, send)
            return
        wait = self.limiter.take(key.key_id)
        if wait is not None:
            error = RateLimitedError(
                f"API key {key.key_id} is over its rate limit; retry in {wait:.2f}s", retry_after=wait
            )
            await error_response(error)(scope, receive, send)
            return
        if not self.audit_enabled or scope["path"].startswith(PREFIX + "/static/"):
            await self._read_and_run(scope, receive, send)
            return
        entry = audit.AuditScope(actor=key.key_id, action=None)
        token = audit.SCOPE.set(entry)

        async def send_recorded(message: dict) -> None:
            if message["type"] == "http.response.start" and not entry.recorded:
                await _record(self._named(entry, scope), scope, self.state, message["status"])
            await send(message)

        try:
            await self._read_and_run(scope, receive, send_recorded)
        finally:
            audit.SCOPE.reset(token)
            if not entry.recorded:
                with anyio.CancelScope(shield=True):
                    await _record(self._named(entry, scope), scope, self.state, None)

    @staticmethod
    def _named(entry: audit.AuditScope, scope: dict) -> audit.AuditScope:
        """The entry's action: the console route, so the trail tells console use from the HTTP API's."""
        if entry.action is None:
            route = getattr(scope.get("route"), "path", None) or "/…"
            entry.action = f"{scope['method']} {PREFIX}{route}"
        return entry
