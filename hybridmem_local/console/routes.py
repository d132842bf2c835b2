"""The console's pages (see the package docstring): each gets its operations handle the way the
HTTP routes do (``Operations.on(handle, KeyScope(key), namespace)``) and renders a template."""

from __future__ import annotations

import difflib
import logging
import secrets
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlencode

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from hybridmem_local.console.guard import (
    COOKIE,
    PREFIX,
    SIGN_IN_COOKIE,
    BrowserSession,
    BrowserSessions,
    ConsoleGuard,
)
from hybridmem_local.errors import ForbiddenError, HybridMemError, InvalidInputError, NotFoundError
from hybridmem_local.schema import MemoryKind
from hybridmem_local.service.errors import internal_error
from hybridmem_local.service.guard import NO_AUTH_KEY
from hybridmem_local.service.keys import ALL_NAMESPACES, ApiKey, Role
from hybridmem_local.service.operations import Admin, Handle, KeyScope, Operations, Reader, Writer
from hybridmem_local.service.schemas import MAX_QUERY_CHARS, MAX_REASON_CHARS
from hybridmem_local.storage import audit

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
#: Rows on one page of a list.
PAGE = 50
#: Hits per store a search shows (tuples: twice as many, as the API returns).
SEARCH_K = 20
EPISODE_FIELDS = ("title", "summary", "details", "timestamp")
TUPLE_FIELDS = ("entity", "relation", "object", "context", "timestamp")

templates = Jinja2Templates(directory=str(HERE / "templates"))


class SignInRequired(Exception):
    """No valid session: the browser is sent to the sign-in page."""


# --------------------------------------------------------------------------- dependencies


def _ops(request: Request) -> Operations:
    return request.app.state.operations


def _key(request: Request) -> ApiKey:
    key = request.scope["state"].get("api_key")
    if key is None:
        raise SignInRequired
    return key


def _session(request: Request) -> BrowserSession:
    session = request.scope["state"].get("console_session")
    if session is None:
        raise SignInRequired
    return session


async def _form(request: Request) -> dict[str, str]:
    """The POST's form fields, once its CSRF token matched the session's (403 otherwise)."""
    session = _session(request)
    body = (await request.body()).decode("utf-8")
    form = {name: values[-1] for name, values in parse_qs(body, keep_blank_values=True).items()}
    if not session.csrf_ok(form.get("csrf")):
        raise ForbiddenError("missing or wrong CSRF token: reload the page and try again")
    return form


def _on(handle: type[Handle]):
    def dependency(request: Request, namespace: str) -> Handle:
        return _ops(request).on(handle, KeyScope(_key(request)), namespace)

    return dependency


Key = Annotated[ApiKey, Depends(_key)]
Form = Annotated[dict[str, str], Depends(_form)]
Reads = Annotated[Reader, Depends(_on(Reader))]
Writes = Annotated[Writer, Depends(_on(Writer))]
Administers = Annotated[Admin, Depends(_on(Admin))]


def _page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    state = request.scope["state"]
    key: ApiKey | None = state.get("api_key")
    session: BrowserSession | None = state.get("console_session")
    namespace = context.get("namespace")
    context.update(
        base=PREFIX,
        key=key,
        csrf=session.csrf if session is not None else "",
        is_audit_admin=key is not None and key.role == Role.admin and key.namespaces == [ALL_NAMESPACES],
        can_write=key is not None and namespace is not None and key.allows(namespace, Role.write),
        can_admin=key is not None and namespace is not None and key.allows(namespace, Role.admin),
    )
    response = templates.TemplateResponse(request, name, context, status_code=status_code)
    response.headers["Cache-Control"] = "no-store"
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def _see(path: str) -> RedirectResponse:
    """After a POST: the page to show (303, so a reload does not post again)."""
    return RedirectResponse(PREFIX + path, status_code=303)


def _reason(form: dict[str, str]) -> str:
    reason = form.get("reason", "").strip()
    if not 1 <= len(reason) <= MAX_REASON_CHARS:
        raise InvalidInputError(f"give a reason of 1-{MAX_REASON_CHARS} characters; it is kept in the history")
    return reason


def _offset(value: str | None) -> int:
    try:
        return max(0, int(value or 0))
    except ValueError:
        raise InvalidInputError(f"offset must be a whole number, got {value!r}") from None


def _date(value: str | None, name: str) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise InvalidInputError(f"{name} must be a date (YYYY-MM-DD), got {value!r}") from None


def _removed_spans(original: str, redacted: str) -> list[tuple[str, bool]]:
    """``original`` cut into (text, removed?) pieces: what the redaction took out, for review."""
    pieces: list[tuple[str, bool]] = []
    for op, a0, a1, _, _ in difflib.SequenceMatcher(None, original, redacted, autojunk=False).get_opcodes():
        if a1 > a0:
            pieces.append((original[a0:a1], op != "equal"))
    return pieces


# --------------------------------------------------------------------------- the app


def console_app(operations: Operations, require_auth: bool = True) -> Any:
    """The console as an ASGI app to mount at ``/console`` (``ConsoleGuard`` around it)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.operations = operations
    app.state.require_auth = require_auth
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    sessions = BrowserSessions()
    app.state.sessions = sessions
    _install_handlers(app)
    _add_routes(app)
    return ConsoleGuard(app, operations.state, require_auth, sessions)


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(SignInRequired)
    async def _sign_in(request: Request, exc: SignInRequired) -> Response:
        if request.method != "GET":
            return _page(request, "error.html", 401, title="Signed out", message="Your session ended: sign in again.")
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{PREFIX}/sign-in?{urlencode({'next': target})}", status_code=303)

    @app.exception_handler(HybridMemError)
    async def _library_error(request: Request, exc: HybridMemError) -> Response:
        if exc.code == "internal":
            exc = internal_error(exc, f"{request.method} {request.url.path}")
        audit.note_outcome(exc.code)
        return _page(request, "error.html", exc.status, title=exc.code.replace("_", " "), message=exc.message)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        audit.note_outcome("validation_error")
        fields = ", ".join(".".join(str(p) for p in e.get("loc", ())) for e in exc.errors())
        return _page(request, "error.html", 422, title="invalid request", message=f"Check: {fields}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        audit.note_outcome("not_found" if exc.status_code == 404 else f"http_{exc.status_code}")
        return _page(request, "error.html", exc.status_code, title=str(exc.status_code), message=str(exc.detail))


def _add_routes(app: FastAPI) -> None:  # noqa: C901 - one function per page, registered together
    # ------------------------------------------------------------------ sign in / out

    @app.get("/", include_in_schema=False)
    def home() -> RedirectResponse:
        return RedirectResponse(PREFIX + "/namespaces", status_code=303)

    @app.get("/sign-in")
    def sign_in_page(request: Request, next: str = "") -> HTMLResponse:
        token = request.cookies.get(SIGN_IN_COOKIE) or secrets.token_urlsafe(32)
        response = _page(
            request, "sign_in.html", form_token=token, next=next, no_auth=not request.app.state.require_auth
        )
        _set_cookie(request, response, SIGN_IN_COOKIE, token, max_age=3600)
        return response

    @app.post("/sign-in")
    async def sign_in(request: Request) -> Response:
        body = (await request.body()).decode("utf-8")
        form = {name: values[-1] for name, values in parse_qs(body, keep_blank_values=True).items()}
        expected = request.cookies.get(SIGN_IN_COOKIE)
        if not expected or not BrowserSession("-", csrf=expected).csrf_ok(form.get("form_token")):
            raise ForbiddenError("the sign-in form expired: reload the page and try again")
        state = request.app.state.operations.state
        if request.app.state.require_auth:
            key = await anyio.to_thread.run_sync(state.keys.authenticate, form.get("api_key", "").strip())
        else:
            key = NO_AUTH_KEY
        if key is None:
            return _page(
                request,
                "sign_in.html",
                401,
                form_token=expected,
                next=form.get("next", ""),
                error="That API key is not valid (unknown, mistyped or revoked).",
            )
        session_id, _ = request.app.state.sessions.open(key.key_id)
        entry = audit.AuditScope(actor=key.key_id, action=f"POST {PREFIX}/sign-in")
        entry.recorded = True
        state.record_audit(entry)
        target = form.get("next", "")
        if not target.startswith(PREFIX + "/") or target.startswith("//"):
            target = PREFIX + "/namespaces"
        response = RedirectResponse(target, status_code=303)
        _set_cookie(request, response, COOKIE, session_id)
        response.delete_cookie(SIGN_IN_COOKIE, path=PREFIX)
        return response

    @app.post("/sign-out")
    def sign_out(request: Request, form: Form) -> Response:
        request.app.state.sessions.close(request.scope["state"].get("console_session_id"))
        response = RedirectResponse(PREFIX + "/sign-in", status_code=303)
        response.delete_cookie(COOKIE, path=PREFIX)
        return response

    # ------------------------------------------------------------------ namespaces and the curation queue

    @app.get("/namespaces")
    def namespaces(request: Request, key: Key, offset: str = "0") -> HTMLResponse:
        start = _offset(offset)
        names = _ops(request).namespaces(key)
        shown = names[start : start + PAGE]
        latest = _ops(request).last_activity(key, shown)  # one query for the page, not one per namespace
        rows = []
        for name in shown:
            stats = _ops(request).on(Reader, KeyScope(key), name).stats()
            rows.append({**_summary(name, stats.counts, stats.index_sizes), "last_activity": latest.get(name)})
        return _page(
            request,
            "namespaces.html",
            rows=rows,
            forgotten=request.query_params.get("forgotten"),
            **_pager(
                lambda offset: f"{PREFIX}/namespaces?{urlencode({'offset': offset})}",
                start,
                start + PAGE if len(names) > start + PAGE else None,
            ),
        )

    @app.get("/namespaces/{namespace}")
    def namespace_page(request: Request, ops: Reads) -> HTMLResponse:
        stats = ops.stats()
        pending, more_pending = ops.sessions("pending", limit=PAGE)
        failed, more_failed = ops.sessions("curation_failed", limit=PAGE)
        return _page(
            request,
            "namespace.html",
            namespace=ops.namespace,
            summary=_summary(ops.namespace, stats.counts, stats.index_sizes),
            counts=sorted(stats.counts.items()),
            pending=pending,
            failed=failed,
            more_pending=more_pending,
            more_failed=more_failed,
        )

    @app.post("/namespaces/{namespace}/forget")
    def forget_namespace(ops: Administers, form: Form) -> Response:
        # The same handle as DELETE /v1/namespaces/{namespace}; the typed name guards against a slip.
        if form.get("confirm_text", "").strip() != ops.namespace:
            raise InvalidInputError(f"type the namespace's name, {ops.namespace}, to forget it")
        ops.forget()
        return _see(f"/namespaces?{urlencode({'forgotten': ops.namespace})}")

    # ------------------------------------------------------------------ memories

    @app.get("/namespaces/{namespace}/memories")
    def memories(
        request: Request,
        ops: Reads,
        kind: str = "",
        status: str = "active",
        q: str = "",
        since: str = "",
        until: str = "",
        offset: str = "0",
    ) -> HTMLResponse:
        kind_filter: MemoryKind | None = kind if kind in ("episode", "tuple") else None  # type: ignore[assignment]
        if status not in ("active", "superseded", "deleted", "any"):
            raise InvalidInputError(f"status must be active, superseded, deleted or any, got {status!r}")
        filters = {"kind": kind, "status": status, "q": q, "since": since, "until": until}
        context: dict[str, Any] = {"namespace": ops.namespace, "filters": filters}
        if q.strip():
            if len(q) > MAX_QUERY_CHARS:
                raise InvalidInputError(f"the search text is longer than {MAX_QUERY_CHARS} characters")
            result = ops.search(
                q,
                k=SEARCH_K,
                kinds=[kind_filter] if kind_filter else None,
                since=_date(since, "since"),
                until=_date(until, "until"),
            )
            context.update(search=result)
        else:
            start = _offset(offset)
            page = ops.list_memories(
                kind_filter,
                status,  # type: ignore[arg-type]
                PAGE,
                start,
                since=_date(since, "since"),
                until=_date(until, "until"),
            )
            query = {k: v for k, v in filters.items() if v and k in ("kind", "status", "since", "until")}
            context.update(
                page=page,
                **_pager(
                    lambda offset: _url(ops.namespace, "memories", {**query, "offset": offset}), start, page.next_offset
                ),
            )
        return _page(request, "memories.html", **context)

    @app.get("/namespaces/{namespace}/memories/{memory_id}")
    def memory_page(request: Request, ops: Reads, memory_id: int) -> HTMLResponse:
        memory = ops.memory(memory_id)
        history = ops.history(memory_id)
        session = None
        if memory.source_session_id:
            try:
                session = ops.session(memory.source_session_id)
            except NotFoundError:
                session = None
        supersedes = sorted(
            {
                int(e.before["id"])
                for e in history
                if e.before and isinstance(e.before.get("id"), int) and e.before["id"] != memory_id
            }
        )
        fields = EPISODE_FIELDS if memory.kind == "episode" else TUPLE_FIELDS
        return _page(
            request,
            "memory.html",
            namespace=ops.namespace,
            memory=memory,
            fields=fields,
            history=history,
            session=session,
            highlighted=set(memory.source_turn_ids),
            supersedes=supersedes,
            runs=sorted({e.run_id for e in history if e.run_id is not None}),
        )

    @app.post("/namespaces/{namespace}/memories/{memory_id}/edit")
    def edit_memory(ops: Writes, memory_id: int, form: Form) -> Response:
        reason = _reason(form)
        current = ops.memory(memory_id)
        names = EPISODE_FIELDS if current.kind == "episode" else TUPLE_FIELDS
        changed = {n: form[n] for n in names if n in form and form[n] != getattr(current, n)}
        new = ops.update_memory(memory_id, reason, changed) if changed else current
        return _see(f"/namespaces/{quote(ops.namespace)}/memories/{new.id}")

    @app.post("/namespaces/{namespace}/memories/{memory_id}/delete")
    def delete_memory(ops: Writes, memory_id: int, form: Form) -> Response:
        ops.delete_memory(memory_id, _reason(form))
        return _see(f"/namespaces/{quote(ops.namespace)}/memories/{memory_id}")

    # ------------------------------------------------------------------ sessions

    @app.get("/namespaces/{namespace}/sessions")
    def sessions(request: Request, ops: Reads, status: str = "", offset: str = "0") -> HTMLResponse:
        if status not in ("", "pending", "curated", "curation_failed"):
            raise InvalidInputError(f"status must be pending, curated or curation_failed, got {status!r}")
        start = _offset(offset)
        records, more = ops.sessions(status or None, PAGE, start)
        query = {"status": status} if status else {}
        return _page(
            request,
            "sessions.html",
            namespace=ops.namespace,
            records=records,
            status=status,
            **_pager(
                lambda offset: _url(ops.namespace, "sessions", {**query, "offset": offset}),
                start,
                start + PAGE if more else None,
            ),
        )

    @app.get("/namespaces/{namespace}/sessions/{session_id}")
    def session_page(request: Request, ops: Reads, session_id: str, memory: int | None = None) -> HTMLResponse:
        record = ops.session(session_id)
        curated = ops.session_memories(session_id)
        highlighted: set[str] = set()
        if memory is not None:
            highlighted = {t for m in curated if m.id == memory for t in m.source_turn_ids}
        cited_by: dict[str, list[int]] = {}
        for m in curated:
            for turn_id in m.source_turn_ids:
                cited_by.setdefault(turn_id, []).append(m.id or 0)
        return _page(
            request,
            "session.html",
            namespace=ops.namespace,
            record=record,
            memories=curated,
            highlighted=highlighted,
            cited_by=cited_by,
        )

    @app.post("/namespaces/{namespace}/sessions/{session_id}/retry")
    def retry_curation(ops: Writes, session_id: str, form: Form) -> Response:
        ops.retry_curation(session_id)
        return _see(f"/namespaces/{quote(ops.namespace)}/sessions/{quote(session_id)}")

    # ------------------------------------------------------------------ ask

    @app.get("/namespaces/{namespace}/ask")
    def ask_page(request: Request, ops: Reads) -> HTMLResponse:
        return _page(request, "ask.html", namespace=ops.namespace, answer=None, question="")

    @app.post("/namespaces/{namespace}/ask")
    def ask(request: Request, ops: Reads, form: Form) -> HTMLResponse:
        question = form.get("question", "").strip()
        if not 1 <= len(question) <= MAX_QUERY_CHARS:
            raise InvalidInputError(f"ask a question of 1-{MAX_QUERY_CHARS} characters")
        answer = ops.ask(question)
        return _page(request, "ask.html", namespace=ops.namespace, answer=answer, question=question)

    # ------------------------------------------------------------------ forget and review (admins)

    @app.get("/namespaces/{namespace}/redactions")
    def redactions(request: Request, ops: Administers, status: str = "pending") -> HTMLResponse:
        if status not in ("pending", "confirmed", "undone", "any"):
            raise InvalidInputError(f"status must be pending, confirmed, undone or any, got {status!r}")
        listed = ops.redactions(None if status == "any" else status)  # type: ignore[arg-type]
        texts = {r.id: ops.redaction_texts(r.id) for r in listed if r.status == "pending"}
        spans = {
            rid: {turn: _removed_spans(original, redacted) for turn, (original, redacted) in by_turn.items()}
            for rid, by_turn in texts.items()
        }
        return _page(request, "redactions.html", namespace=ops.namespace, redactions=listed, spans=spans, status=status)

    @app.post("/namespaces/{namespace}/redactions/{redaction_id}/{decision}")
    def decide_redaction(ops: Administers, redaction_id: int, decision: str, form: Form) -> Response:
        if decision == "undo":
            ops.undo_redaction(redaction_id)
        elif decision == "confirm":
            if form.get("confirm_text") != "confirm":
                raise InvalidInputError("type confirm to delete the originals for good")
            ops.confirm_redaction(redaction_id)
        else:
            raise NotFoundError(f"no action {decision!r} on a redaction (undo or confirm)")
        return _see(f"/namespaces/{quote(ops.namespace)}/redactions?status=any")

    # ------------------------------------------------------------------ consolidation (admins)

    def _consolidation(request: Request, ops: Admin, offset: str = "0", **context: Any) -> HTMLResponse:
        start = _offset(offset)
        runs, more = ops.runs(PAGE, start)
        return _page(
            request,
            "consolidation.html",
            namespace=ops.namespace,
            runs=runs,
            **_pager(
                lambda offset: _url(ops.namespace, "consolidation", {"offset": offset}),
                start,
                start + PAGE if more else None,
            ),
            **{"report": None, "undone": None, **context},
        )

    @app.get("/namespaces/{namespace}/consolidation")
    def consolidation_page(request: Request, ops: Administers, offset: str = "0") -> HTMLResponse:
        return _consolidation(request, ops, offset)

    @app.post("/namespaces/{namespace}/consolidation")
    def consolidate(request: Request, ops: Administers, form: Form) -> HTMLResponse:
        if form.get("undo_run"):
            return _consolidation(request, ops, undone=ops.undo(_offset(form["undo_run"]) or 1))
        return _consolidation(request, ops, report=ops.consolidate(dry_run=form.get("mode") != "apply"))

    @app.get("/namespaces/{namespace}/consolidation/runs/{run_id}")
    def run_page(request: Request, ops: Administers, run_id: int) -> HTMLResponse:
        return _page(request, "run.html", namespace=ops.namespace, run=ops.run(run_id))

    # ------------------------------------------------------------------ audit (admins of '*')

    @app.get("/audit")
    def audit_page(
        request: Request, key: Key, actor: str = "", namespace_filter: str = "", since: str = "", offset: str = "0"
    ) -> HTMLResponse:
        reader = _ops(request).audit(key)
        return _audit_page(request, reader, actor, namespace_filter, since, offset, verdict=None)

    @app.post("/audit/verify")
    def verify_audit(request: Request, key: Key, form: Form) -> HTMLResponse:
        reader = _ops(request).audit(key)
        return _audit_page(request, reader, "", "", "", "0", verdict=reader.verify())


def _audit_page(request: Request, reader: Any, actor: str, namespace: str, since: str, offset: str, verdict: Any):
    since_date = _date(since, "since")
    start = _offset(offset)
    # Oldest first, as the trail is chained; a page is the PAGE entries after ``offset`` of the match.
    entries = reader.entries(actor or None, namespace or None, since_date, min(start + PAGE + 1, 1000))
    shown = entries[start : start + PAGE]
    query = {"actor": actor, "namespace_filter": namespace, "since": since}
    return _page(
        request,
        "audit.html",
        entries=shown,
        verdict=verdict,
        filters=query,
        **_pager(
            lambda offset: f"{PREFIX}/audit?{urlencode({**query, 'offset': offset})}",
            start,
            start + PAGE if len(entries) > start + PAGE else None,
        ),
    )


def _pager(link: Callable[[int], str], start: int, next_offset: int | None) -> dict[str, Any]:
    """The Previous and Next links (``pager.html``) of a page starting at ``start``; ``next_offset``
    None: it is the last page."""
    return {
        "next_url": link(next_offset) if next_offset is not None else None,
        "prev_url": link(max(0, start - PAGE)) if start else None,
    }


def _url(namespace: str, page: str, query: dict[str, Any]) -> str:
    return f"{PREFIX}/namespaces/{quote(namespace)}/{page}?{urlencode({k: v for k, v in query.items() if v != ''})}"


def _summary(name: str, counts: dict[str, int], index_sizes: dict[str, int]) -> dict[str, Any]:
    sessions = counts.get("sessions", 0)
    curated = counts.get("sessions_curated", 0)
    return {
        "name": name,
        "sessions": sessions,
        "pending": counts.get("sessions_pending", 0),
        "curated": curated,
        "failed": counts.get("sessions_curation_failed", 0),
        "progress": round(100 * curated / sessions) if sessions else 100,
        "turns": counts.get("turns", 0),
        "episodes": counts.get("episodes_active", 0),
        "tuples": counts.get("tuples_active", 0),
        "retired": sum(n for k, n in counts.items() if k.endswith(("_superseded", "_deleted"))),
        "windows": index_sizes.get(f"{name}/window", index_sizes.get(f"{name}/windows", 0)),
    }


def _set_cookie(request: Request, response: Response, name: str, value: str, max_age: int | None = None) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
