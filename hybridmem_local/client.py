"""``HybridMemoryClient``: the HTTP API of ``hybridmem serve`` behind the methods of ``HybridMemory``.

    from hybridmem_local.client import HybridMemoryClient

    with HybridMemoryClient("https://memory.example.org", api_key=os.environ["HYBRIDMEM_KEY"]) as memory:
        memory.add_session(session)          # queued: curated by the server's worker, not in this call
        result = memory.search("Where did Alice move?", namespace="alice")

Switching from in-process to remote is the line that builds ``memory``: the methods keep the
names, arguments and pydantic return types of :class:`~hybridmem_local.memory.HybridMemory`.
Where the service differs, the signature says so:

* ``add_session`` returns at once with ``curation_status="pending"`` (the server's worker
  curates); poll :meth:`HybridMemoryClient.get_session` for the outcome.
* The service is namespaced, so ``get``, ``delete``, ``history``, ``undo`` and ``stats`` take a
  ``namespace`` keyword (default ``"default"``, like ``search``); ``delete`` takes no reason
  (the server records one).

Errors: an error the library raises in-process comes back as the same exception type —
``NotFoundError`` for a missing memory, ``ValueError`` for a rejected argument, and the service's
``QueueFullError`` / ``AskTimeoutError`` — each also a :class:`ServiceError` carrying the stable
``code``, the message and the HTTP status. Other refusals (unauthorized, forbidden, conflict,
rate_limited with ``retry_after``, payload_too_large, not_ready, internal) raise ``ServiceError``.
"""

from __future__ import annotations

import builtins  # annotations after the method `list` below name the builtin as builtins.list
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, TypeAdapter

from hybridmem_local.answering import Answer
from hybridmem_local.consolidation import ConsolidationReport, UndoReport
from hybridmem_local.files import owner_only_opener
from hybridmem_local.memory import Stats
from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryKind,
    MemoryStatus,
    RelationalTuple,
    SearchResult,
    Session,
    TupleDraft,
    check_namespace,
)
from hybridmem_local.service.models import MAX_PAGE, MemoryOut
from hybridmem_local.service.state import AskTimeoutError, QueueFullError
from hybridmem_local.store import Event, NotFoundError, SessionRecord

#: ``list`` without a limit pages through at the server's largest page.
PAGE_SIZE = MAX_PAGE

_MEMORY = TypeAdapter(MemoryOut)
_EVENTS = TypeAdapter(list[Event])


class ServiceError(Exception):
    """A refusal of the service: its stable ``code``, the message naming what is wrong, the HTTP status."""

    def __init__(self, code: str, message: str, status: int, retry_after: float | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        #: Seconds to wait before retrying (``rate_limited``), from the Retry-After header.
        self.retry_after = retry_after


class ServiceNotFoundError(ServiceError, NotFoundError):
    pass


class ServiceValueError(ServiceError, ValueError):
    pass


class ServiceQueueFullError(ServiceError, QueueFullError):
    pass


class ServiceTimeoutError(ServiceError, AskTimeoutError):
    pass


#: Codes raised as the exception the library raises in-process for the same condition.
_LIBRARY_ERRORS: dict[str, type[ServiceError]] = {
    "not_found": ServiceNotFoundError,
    "validation_error": ServiceValueError,
    "bad_request": ServiceValueError,
    "queue_full": ServiceQueueFullError,
    "timeout": ServiceTimeoutError,
}


class _ErrorBody(BaseModel):
    code: str
    message: str


class _ErrorResponse(BaseModel):
    error: _ErrorBody


class _SessionAccepted(BaseModel):
    model_config = ConfigDict(extra="ignore")

    curation_status: str


class _MemoriesAdded(BaseModel):
    model_config = ConfigDict(extra="ignore")

    ids: list[int]


class _MemoryPage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    items: list[MemoryOut]
    next_offset: int | None


class _ForgetReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    removed: dict[str, int]


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
        self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None
    ) -> httpx.Response:
        response = self._http.request(method, path, json=json, params=params)
        if response.is_error:
            raise _error(response)
        return response

    @staticmethod
    def _ns(namespace: str) -> str:
        """The namespace's URL prefix; a namespace name is URL-safe once ``check_namespace`` accepts it."""
        return f"/v1/namespaces/{check_namespace(namespace)}"

    # ------------------------------------------------------------------ writes

    def add_session(self, session: Session) -> SessionRecord:
        """Store the session's raw turns and queue it for curation by the server's worker."""
        body = session.model_dump(mode="json", exclude={"namespace"})
        accepted = _SessionAccepted.model_validate(
            self._request("POST", f"{self._ns(session.namespace)}/sessions", json=body).json()
        )
        return SessionRecord(session=session, curation_status=accepted.curation_status)

    def get_session(self, namespace: str, session_id: str) -> SessionRecord:
        """A stored session with its curation status (``pending``, ``curated``, ``curation_failed``)."""
        path = f"{self._ns(namespace)}/sessions/{quote(session_id, safe='')}"
        return SessionRecord.model_validate(self._request("GET", path).json())

    def add_memories(
        self, namespace: str, episodes: Iterable[EpisodeDraft] = (), tuples: Iterable[TupleDraft] = ()
    ) -> list[int]:
        """Store memories as given (no curation); returns their ids."""
        body = {
            # Stored memories (Episode, RelationalTuple) are drafts too: only the draft fields travel.
            "episodes": [e.model_dump(mode="json", include=set(EpisodeDraft.model_fields)) for e in episodes],
            "tuples": [t.model_dump(mode="json", include=set(TupleDraft.model_fields)) for t in tuples],
        }
        return _MemoriesAdded.model_validate(
            self._request("POST", f"{self._ns(namespace)}/memories", json=body).json()
        ).ids

    def delete(self, memory_id: int, *, namespace: str = "default") -> None:
        """Mark a memory deleted (kept in its history)."""
        self._request("DELETE", f"{self._ns(namespace)}/memories/{int(memory_id)}")

    def forget(self, namespace: str) -> dict[str, int]:
        """Remove every trace of a namespace (admin key)."""
        return _ForgetReport.model_validate(self._request("DELETE", self._ns(namespace)).json()).removed

    # ------------------------------------------------------------------ consolidation (admin key)

    def consolidate(self, namespace: str, dry_run: bool = False) -> ConsolidationReport:
        response = self._request("POST", f"{self._ns(namespace)}/consolidate", json={"dry_run": dry_run})
        return ConsolidationReport.model_validate(response.json())

    def undo(self, run_id: int, *, namespace: str = "default") -> UndoReport:
        response = self._request("POST", f"{self._ns(namespace)}/consolidation-runs/{int(run_id)}/undo")
        return UndoReport.model_validate(response.json())

    # ------------------------------------------------------------------ reads

    def search(self, query: str, namespace: str = "default", k: int | None = None) -> SearchResult:
        response = self._request("POST", f"{self._ns(namespace)}/search", json={"query": query, "k": k})
        return SearchResult.model_validate(response.json())

    def answer(
        self, question: str, namespace: str = "default", question_date: datetime | None = None, k: int | None = None
    ) -> Answer:
        body = {"question": question, "question_date": question_date.isoformat() if question_date else None, "k": k}
        return Answer.model_validate(self._request("POST", f"{self._ns(namespace)}/ask", json=body).json())

    def get(self, memory_id: int, *, namespace: str = "default") -> Episode | RelationalTuple:
        return _MEMORY.validate_python(self._request("GET", f"{self._ns(namespace)}/memories/{int(memory_id)}").json())

    def list(
        self,
        namespace: str = "default",
        kind: MemoryKind | None = None,
        status: MemoryStatus | None = MemoryStatus.active,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Episode | RelationalTuple]:
        """Memories in id order (``status=None``: any status); without ``limit``, every page."""
        if (limit is not None and limit < 0) or offset < 0:
            raise ValueError(f"limit and offset must not be negative, got limit={limit} offset={offset}")
        out: list[Episode | RelationalTuple] = []
        next_offset: int | None = offset
        while next_offset is not None and (limit is None or len(out) < limit):
            size = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(out))
            params = {"limit": size, "offset": next_offset, "status": MemoryStatus(status).value if status else "any"}
            if kind is not None:
                params["kind"] = kind
            page = _MemoryPage.model_validate(
                self._request("GET", f"{self._ns(namespace)}/memories", params=params).json()
            )
            out.extend(page.items)
            next_offset = page.next_offset
        return out

    def history(self, memory_id: int, *, namespace: str = "default") -> builtins.list[Event]:
        return _EVENTS.validate_python(
            self._request("GET", f"{self._ns(namespace)}/memories/{int(memory_id)}/history").json()
        )

    def stats(self, namespace: str = "default") -> Stats:
        return Stats.model_validate(self._request("GET", f"{self._ns(namespace)}/stats").json())

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


def _error(response: httpx.Response) -> ServiceError:
    """The exception for an error answer: the library's type where there is one, else ServiceError."""
    try:
        body = _ErrorResponse.model_validate(response.json()).error
        code, message = body.code, body.message
    except ValueError:  # not the service's error JSON (a proxy's error page, say)
        code, message = "http_error", f"HTTP {response.status_code}: {response.text[:200]}"
    retry_after = response.headers.get("Retry-After")
    cls = _LIBRARY_ERRORS.get(code, ServiceError)
    return cls(
        code, message, response.status_code, float(retry_after) if retry_after and retry_after.isdigit() else None
    )
