"""``HybridMemoryClient``: the HTTP API of ``hybridmem serve`` behind the methods of ``HybridMemory``.

    from hybridmem_local.service.client import HybridMemoryClient

    with HybridMemoryClient("https://memory.example.org", api_key=os.environ["HYBRIDMEM_KEY"]) as memory:
        memory.enqueue([session])            # queued: curated by the server's worker, not in this call
        result = memory.search("Where did Alice move?", namespace="alice")

Switching from in-process to remote is the line that builds ``memory``: both implement
:class:`~hybridmem_local.api.MemoryAPI`, with the same names, arguments and pydantic return
types. Where the service differs, the names or the arguments say so:

* ``add_session`` returns at once with ``curation_status="pending"`` (the server's worker
  curates); poll :meth:`HybridMemoryClient.get_session` for the outcome. ``enqueue`` is the
  same in-process and here.
* The service scopes every memory id and consolidation run by namespace, so ``get``, ``delete``,
  ``history``, ``undo`` and ``stats`` need their ``namespace`` keyword (None, which in-process
  means any namespace, is refused here rather than guessed).

Errors: the service's answer comes back as the class of the library's error tree that its code
names (``hybridmem_local.errors.ERROR_CODES``), with the server's message: ``NotFoundError`` for
a missing memory, ``InvalidInputError`` (a ``ValueError``) for a rejected argument,
``ForbiddenError``, ``ConflictError``, ``QueueFullError``, ``AskTimeoutError``,
``RateLimitedError`` with ``retry_after``... — the same classes the library raises in-process,
each with its ``code`` and HTTP ``status``. An answer that is not the service's error JSON (a
proxy's error page) raises ``HybridMemError`` naming the HTTP status.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from hybridmem_local.errors import ERROR_CODES, HybridMemError, InvalidInputError, RateLimitedError
from hybridmem_local.files.paths import owner_only_opener
from hybridmem_local.results import (
    Answer,
    ConsolidationReport,
    Event,
    Redaction,
    RedactionStatus,
    SearchResult,
    SessionRecord,
    Stats,
    UndoReport,
)
from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryKind,
    MemoryStatus,
    Message,
    RelationalTuple,
    Session,
    TupleDraft,
    check_namespace,
    check_page,
)
from hybridmem_local.service.schemas import (
    MAX_BATCH,
    MAX_PAGE,
    AskIn,
    ConsolidateIn,
    ErrorResponse,
    ForgetReport,
    ListQuery,
    MemoriesAdded,
    MemoriesIn,
    MemoryOut,
    MemoryPage,
    MessagesAccepted,
    MessagesIn,
    SearchIn,
    SessionAccepted,
    SessionBatchIn,
    SessionIn,
)

#: ``list`` without a limit pages through at the server's largest page.
PAGE_SIZE = MAX_PAGE

_MEMORY = TypeAdapter(MemoryOut)
_EVENTS = TypeAdapter(list[Event])
_REDACTIONS = TypeAdapter(list[Redaction])
_SESSIONS_ACCEPTED = TypeAdapter(list[SessionAccepted])


class HybridMemoryClient:
    """A remote store with the methods of ``HybridMemory`` (see the module docstring)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 150.0):
        """``timeout`` (seconds) bounds each request; keep it above the server's
        ``service.ask_timeout_s`` (120 s by default) so ``answer`` gets the server's own timeout error."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    def __enter__(self) -> HybridMemoryClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ plumbing

    def _request(
        self, method: str, path: str, *, body: BaseModel | None = None, params: dict[str, Any] | None = None
    ) -> httpx.Response:
        """``body``: one of the request models the routes parse (service/schemas.py), sent as JSON.
        Each is built with ``model_construct``: the server validates it and refuses with its own
        error code, the same answer any other client gets."""
        json = None if body is None else body.model_dump(mode="json")
        response = self._http.request(method, path, json=json, params=params)
        if response.is_error:
            raise _error(response)
        return response

    @staticmethod
    def _ns(namespace: str | None, what: str = "") -> str:
        """The namespace's URL prefix; a namespace name is URL-safe once ``check_namespace`` accepts it."""
        if namespace is None:
            raise InvalidInputError(
                f"the service scopes {what or 'this'} by namespace: pass namespace=... (None means any "
                "namespace only in-process)"
            )
        return f"/v1/namespaces/{check_namespace(namespace)}"

    # ------------------------------------------------------------------ writes

    def add_session(self, session: Session) -> SessionRecord:
        """Store the session's raw turns and queue it for curation by the server's worker."""
        path = f"{self._ns(session.namespace)}/sessions"
        accepted = SessionAccepted.model_validate(self._request("POST", path, body=_session_in(session)).json())
        return SessionRecord(session=session, curation_status=accepted.curation_status)

    def enqueue(self, sessions: Sequence[Session]) -> list[SessionRecord]:
        """Store sessions raw as ``pending`` for the server's worker: one request per namespace and
        up to MAX_BATCH sessions, each all or none."""
        records: dict[int, SessionRecord] = {}
        by_namespace: dict[str, list[int]] = {}
        for position, session in enumerate(sessions):
            by_namespace.setdefault(session.namespace, []).append(position)
        for namespace, positions in by_namespace.items():
            for start in range(0, len(positions), MAX_BATCH):
                chunk = positions[start : start + MAX_BATCH]
                body = SessionBatchIn.model_construct(sessions=[_session_in(sessions[i]) for i in chunk])
                accepted = _SESSIONS_ACCEPTED.validate_python(
                    self._request("POST", f"{self._ns(namespace)}/sessions/batch", body=body).json()
                )
                for i, answer in zip(chunk, accepted, strict=True):
                    records[i] = SessionRecord(session=sessions[i], curation_status=answer.curation_status)
        return [records[i] for i in range(len(sessions))]

    def add_messages(self, namespace: str, messages: Sequence[Message], session_id: str | None = None) -> SessionRecord:
        """Chat messages (``{role, content}``) stored as a session dated now (by the server's
        clock), the speaker from the role, and queued for curation."""
        body = MessagesIn.model_construct(messages=list(messages), session_id=session_id)
        accepted = MessagesAccepted.model_validate(
            self._request("POST", f"{self._ns(namespace)}/messages", body=body).json()
        )
        # The server built the session by the same rule: rebuilt here from its id and date.
        session = Session.from_messages(namespace, messages, accepted.session_id, accepted.started_at)
        return SessionRecord(session=session, curation_status=accepted.curation_status)

    def remember(self, namespace: str, text: str) -> SessionRecord:
        """Plain text stored as a one-message session from the user, dated now, and queued for curation."""
        return self.add_messages(namespace, [Message.from_user(text)])

    def get_session(self, namespace: str, session_id: str) -> SessionRecord:
        """A stored session with its curation status (``pending``, ``curated``, ``curation_failed``)."""
        path = f"{self._ns(namespace)}/sessions/{quote(session_id, safe='')}"
        return SessionRecord.model_validate(self._request("GET", path).json())

    def add_memories(
        self, namespace: str, episodes: Iterable[EpisodeDraft] = (), tuples: Iterable[TupleDraft] = ()
    ) -> list[int]:
        """Store memories as given (no curation); returns their ids."""
        # Stored memories (Episode, RelationalTuple) are drafts too: serialized as the body's
        # draft type, only the draft fields travel.
        body = MemoriesIn.model_construct(episodes=list(episodes), tuples=list(tuples))
        return MemoriesAdded.model_validate(
            self._request("POST", f"{self._ns(namespace)}/memories", body=body).json()
        ).ids

    def delete(self, memory_id: int, reason: str = "deleted by user", *, namespace: str | None = None) -> None:
        """Mark a memory deleted (kept in its history, with ``reason``)."""
        path = f"{self._ns(namespace, 'memory ids')}/memories/{int(memory_id)}"
        self._request("DELETE", path, params={"reason": reason})

    def forget(self, namespace: str) -> dict[str, int]:
        """Remove every trace of a namespace (admin key)."""
        return ForgetReport.model_validate(self._request("DELETE", self._ns(namespace)).json()).removed

    # ------------------------------------------------------------------ consolidation (admin key)

    def consolidate(self, namespace: str, dry_run: bool = False) -> ConsolidationReport:
        body = ConsolidateIn.model_construct(dry_run=dry_run)
        response = self._request("POST", f"{self._ns(namespace)}/consolidate", body=body)
        return ConsolidationReport.model_validate(response.json())

    def undo(self, run_id: int, *, namespace: str | None = None) -> UndoReport:
        path = f"{self._ns(namespace, 'consolidation runs')}/consolidation-runs/{int(run_id)}/undo"
        return UndoReport.model_validate(self._request("POST", path).json())

    # ------------------------------------------------------------------ redactions (admin key)

    def redactions(self, namespace: str, status: RedactionStatus | None = None) -> list[Redaction]:
        params = {"status": status} if status is not None else None
        return _REDACTIONS.validate_python(
            self._request("GET", f"{self._ns(namespace)}/redactions", params=params).json()
        )

    def undo_redaction(self, redaction_id: int, *, namespace: str | None = None) -> Redaction:
        path = f"{self._ns(namespace, 'redactions')}/redactions/{int(redaction_id)}/undo"
        return Redaction.model_validate(self._request("POST", path).json())

    def confirm_redaction(self, redaction_id: int, *, namespace: str | None = None) -> Redaction:
        path = f"{self._ns(namespace, 'redactions')}/redactions/{int(redaction_id)}/confirm"
        return Redaction.model_validate(self._request("POST", path).json())

    # ------------------------------------------------------------------ reads

    def search(
        self,
        query: str,
        namespace: str = "default",
        k: int | None = None,
        kinds: Sequence[MemoryKind] | None = None,
        since: date | datetime | None = None,
        until: date | datetime | None = None,
        min_score: float | None = None,
    ) -> SearchResult:
        body = SearchIn.model_construct(
            query=query,
            k=k,
            kinds=None if kinds is None else list(kinds),
            since=since,
            until=until,
            min_score=min_score,
        )
        response = self._request("POST", f"{self._ns(namespace)}/search", body=body)
        return SearchResult.model_validate(response.json())

    def answer(
        self, question: str, namespace: str = "default", question_date: datetime | None = None, k: int | None = None
    ) -> Answer:
        body = AskIn.model_construct(question=question, question_date=question_date, k=k)
        return Answer.model_validate(self._request("POST", f"{self._ns(namespace)}/ask", body=body).json())

    def get(self, memory_id: int, *, namespace: str | None = None) -> Episode | RelationalTuple:
        path = f"{self._ns(namespace, 'memory ids')}/memories/{int(memory_id)}"
        return _MEMORY.validate_python(self._request("GET", path).json())

    def history(self, memory_id: int, *, namespace: str | None = None) -> list[Event]:
        path = f"{self._ns(namespace, 'memory ids')}/memories/{int(memory_id)}/history"
        return _EVENTS.validate_python(self._request("GET", path).json())

    def stats(self, namespace: str | None = None) -> Stats:
        return Stats.model_validate(self._request("GET", f"{self._ns(namespace, 'stats')}/stats").json())

    def export(self, namespace: str, path: str | Path) -> int:
        """Write the namespace as JSONL at ``path`` (owner-only), streamed; returns the line count."""
        lines = 0
        with self._http.stream("GET", f"{self._ns(namespace)}/export") as response:
            if response.is_error:
                response.read()
                raise _error(response)
            with open(path, "w", encoding="utf-8", opener=owner_only_opener) as out:
                for line in response.iter_lines():
                    if line:
                        out.write(line + "\n")
                        lines += 1
        return lines

    # Last: a method named ``list`` would shadow the builtin in the annotations after it.
    def list(
        self,
        namespace: str = "default",
        kind: MemoryKind | None = None,
        status: MemoryStatus | None = MemoryStatus.active,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Episode | RelationalTuple]:
        """Memories in id order (``status=None``: any status); without ``limit``, every page."""
        check_page(limit, offset)
        out: list[Episode | RelationalTuple] = []
        next_offset: int | None = offset
        while next_offset is not None and (limit is None or len(out) < limit):
            size = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(out))
            query = ListQuery.model_construct(
                kind=kind, status=MemoryStatus(status).value if status else "any", limit=size, offset=next_offset
            )
            params = query.model_dump(mode="json", exclude_none=True)
            page = MemoryPage.model_validate(
                self._request("GET", f"{self._ns(namespace)}/memories", params=params).json()
            )
            out.extend(page.items)
            next_offset = page.next_offset
        return out


def _session_in(session: Session) -> SessionIn:
    """The request body of a session: its namespace is the request's."""
    return SessionIn.model_construct(session_id=session.session_id, started_at=session.started_at, turns=session.turns)


def _error(response: httpx.Response) -> HybridMemError:
    """The exception for an error answer: the class the error table gives its code, with its message."""
    try:
        body = ErrorResponse.model_validate(response.json()).error
    except ValueError:  # not the service's error JSON (a proxy's error page, say)
        return HybridMemError(f"HTTP {response.status_code} from {response.url}: {response.text[:200]}")
    if body.code not in ERROR_CODES:  # a newer server's code: the message still says what is wrong
        return HybridMemError(f"{body.code} (HTTP {response.status_code}): {body.message}")
    error = ERROR_CODES[body.code].error
    if error is RateLimitedError:
        retry_after = response.headers.get("Retry-After", "")
        return RateLimitedError(body.message, retry_after=float(retry_after) if retry_after.isdigit() else None)
    return error(body.message)
