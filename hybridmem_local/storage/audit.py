"""The ``audit_log`` table: who did what, as a hash chain. Never text, queries or secrets.

One entry per operation: its time, actor (an API key id, ``worker``, or ``local:<os user>`` for
the Python API and the CLI), action (``POST /v1/namespaces/{namespace}/search``,
``HybridMemory.search``), namespace, the ids it read or changed (``refs``: memory ids read,
changed and shown to an answer's LLM, window, session, key and redaction ids) and its outcome (``ok`` or
an error code). Each entry stores ``prev_hash`` (the previous entry's hash) and ``hash``
(SHA-256 of its own fields and ``prev_hash``), so an edited, deleted or moved entry breaks the
chain at that entry (:meth:`AuditLog.verify`). Triggers refuse UPDATE and refuse DELETE except
of entries an anchor has trimmed: trimming (:meth:`AuditLog.trim`) keeps the hash of the last
entry it removes in ``audit_anchor``, where verification starts.

Who is acting travels in a context variable (:data:`SCOPE`): the outermost operation opens an
:class:`AuditScope` (the service per request, with the key id and route; the facade otherwise),
every nested operation adds its ids to that one, and the scope becomes one entry per namespace
when the outermost operation ends. Context variables follow a request into the threads that
FastAPI, anyio and the MCP SDK run its sync code in (each copies the context), and the scope is
one shared object, so ids noted there land in the request's entry.

Writing: an operation appends its entry on its own connection in a short write transaction
of its own (~0.1 ms; on SQLite a commit of this connection does not move its indexes' change
marker, as another connection's would). When another connection holds the write lock (the
curation worker, a CLI ingest, a VACUUM) for more than ``LOCK_WAIT_MS``, the entry goes to
:class:`AuditWriter` instead, one thread per store with its own connection, so a read never
stalls behind a long write; entries queued there in the last moments before a crash are lost.
The previous hash is read inside the same write transaction that appends, which holds the
store's writer lock (SQLite's ``BEGIN IMMEDIATE``, PostgreSQL's advisory lock), so writers of
several connections, processes and replicas extend one linear chain. An entry's id is part of
its hash, so entries are inserted with the ids the chain gives them, never the database's.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict

from hybridmem_local.errors import AuditChainError, HybridMemError, StoreUnavailableError
from hybridmem_local.schema import utcnow
from hybridmem_local.storage.connection import Database

log = logging.getLogger(__name__)

#: The ``prev_hash`` of the first entry of a chain that was never trimmed.
GENESIS = "0" * 64
#: Entries a writer holds before ``submit`` waits for it (a disk that stopped taking writes).
MAX_QUEUED = 10_000
#: How long an operation waits for the store's write lock to append its entry itself before it
#: hands the entry to the writer thread instead (another connection holds a write transaction).
LOCK_WAIT_MS = 50
#: Seconds a writer waits before retrying a failed append (the entries stay queued meanwhile).
RETRY_S = 0.5

Ref = int | str


@dataclass
class AuditScope:
    """One operation in progress: who, what, and the ids it touched per namespace."""

    actor: str
    action: str | None
    at: datetime = field(default_factory=utcnow)
    outcome: str = "ok"
    #: namespace (None: none named) → kind of reference → ids, in the order first noted.
    refs: dict[str | None, dict[str, dict[Ref, None]]] = field(default_factory=dict)
    #: Facade operations open inside this scope (only the outermost one reports its result's ids).
    depth: int = 0
    #: Handed to the store already (the service records a request as its response starts).
    recorded: bool = False

    def fail(self, code: str) -> None:
        """Mark the operation failed with ``code``; the first error noted stays."""
        if self.outcome == "ok":
            self.outcome = code

    def note(self, namespace: str | None, **refs: Iterable[Ref]) -> None:
        kinds = self.refs.setdefault(namespace, {})
        for kind, ids in refs.items():
            kinds.setdefault(kind, {}).update(dict.fromkeys(ids))

    def entries(self) -> list[PendingEntry]:
        """One entry per namespace touched (namespace None only when the operation named none)."""
        named: dict[str | None, dict[str, dict[Ref, None]]] = {
            ns: kinds for ns, kinds in self.refs.items() if ns is not None
        }
        if not named:
            named = {None: self.refs.get(None, {})}
        elif None in self.refs and len(named) == 1:  # ids noted without a namespace: the one named
            for kind, ids in self.refs[None].items():
                next(iter(named.values())).setdefault(kind, {}).update(ids)
        return [
            PendingEntry(
                at=self.at.isoformat(),
                actor=self.actor,
                action=self.action or "unknown",
                namespace=ns,
                refs={kind: list(ids) for kind, ids in sorted(kinds.items()) if ids},
                outcome=self.outcome,
            )
            for ns, kinds in sorted(named.items(), key=lambda item: item[0] or "")
        ]


#: The scope of the operation this context is inside, if any.
SCOPE: ContextVar[AuditScope | None] = ContextVar("hybridmem_audit_scope", default=None)
#: Who acts when no key does (the curation worker sets ``worker``); default ``local:<os user>``.
ACTOR: ContextVar[str | None] = ContextVar("hybridmem_audit_actor", default=None)


def local_actor() -> str:
    try:
        return f"local:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name for this uid (a bare container)
        return "local"


_LOCAL_ACTOR = local_actor()


def note(namespace: str | None, **refs: Iterable[Ref]) -> None:
    """Add ids to the operation in progress (nothing outside one)."""
    scope = SCOPE.get()
    if scope is not None:
        scope.note(namespace, **refs)


def note_outcome(code: str) -> None:
    """Mark the operation in progress failed with ``code`` (the first error noted stays)."""
    scope = SCOPE.get()
    if scope is not None:
        scope.fail(code)


def outcome_of(exc: BaseException) -> str:
    return exc.code if isinstance(exc, HybridMemError) else "internal"


@contextmanager
def operation(action: str, sink: Callable[[AuditScope], None]) -> Iterator[AuditScope]:
    """The scope of an operation: the one in progress when there is one (this operation is part
    of it), else a new one handed to ``sink`` when the block ends, failed or not."""
    outer = SCOPE.get()
    if outer is not None:
        try:
            yield outer
        except BaseException as exc:
            note_outcome(outcome_of(exc))
            raise
        return
    scope = AuditScope(actor=ACTOR.get() or _LOCAL_ACTOR, action=action)
    token = SCOPE.set(scope)
    try:
        yield scope
    except BaseException as exc:
        note_outcome(outcome_of(exc))
        raise
    finally:
        SCOPE.reset(token)
        sink(scope)


@contextmanager
def acting_as(actor: str) -> Iterator[None]:
    """Operations of this block are recorded as ``actor`` (e.g. the curation worker)."""
    token = ACTOR.set(actor)
    try:
        yield
    finally:
        ACTOR.reset(token)


# --------------------------------------------------------------------------- entries and the chain


class PendingEntry(BaseModel):
    """An entry before it is chained: what an operation records."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: str
    actor: str
    action: str
    namespace: str | None
    refs: dict[str, list[Ref]]
    outcome: str


class AuditEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: int
    at: datetime
    actor: str
    action: str
    namespace: str | None
    refs: dict[str, list[Ref]]
    outcome: str
    prev_hash: str
    hash: str


class Verdict(BaseModel):
    """What ``verify`` found: ``ok``, or the first bad entry and why."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    entries: int
    #: The id the chain starts after (the last trimmed entry), 0 when never trimmed.
    anchor_id: int
    #: The last entry's hash: kept elsewhere, it also shows later removal of the newest entries.
    head_hash: str
    first_bad_id: int | None = None
    problem: str | None = None


def entry_hash(
    entry_id: int, at: str, actor: str, action: str, namespace: str | None, refs: Any, outcome: str, prev_hash: str
) -> str:
    """SHA-256 of the entry's canonical JSON (sorted keys, no spaces, ASCII) with its id and
    ``prev_hash``: the id is in it, so moving an entry to another position breaks it too."""
    canonical = json.dumps(
        {
            "id": entry_id,
            "at": at,
            "actor": actor,
            "action": action,
            "namespace": namespace,
            "refs": refs,
            "outcome": outcome,
            "prev_hash": prev_hash,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


class AuditLog:
    """The audit trail of one store (``store.audit``)."""

    def __init__(self, db: Database):
        self.db = db
        self._writer: AuditWriter | None = None
        self._writer_lock = threading.Lock()

    # ------------------------------------------------------------------ writing

    def append(self, entries: Sequence[PendingEntry]) -> list[int]:
        """Chain and store ``entries`` in one write transaction; returns their ids. No index
        holds the trail, so other replicas' indexes are not told to look again."""
        with self.db.transaction(indexed=False) as c:
            last = c.execute("SELECT id, hash FROM audit_log ORDER BY id DESC LIMIT 1").fetchone()
            if last is None:
                last = c.execute("SELECT through_id, hash FROM audit_anchor WHERE id = 1").fetchone()
            entry_id, prev = tuple(last) if last is not None else (0, GENESIS)
            ids = []
            for entry in entries:
                entry_id += 1
                digest = entry_hash(
                    entry_id, entry.at, entry.actor, entry.action, entry.namespace, entry.refs, entry.outcome, prev
                )
                c.execute(
                    "INSERT INTO audit_log (id, at, actor, action, namespace, refs, outcome, prev_hash, hash) "
                    "VALUES (:id, :at, :actor, :action, :namespace, :refs, :outcome, :prev_hash, :hash)",
                    {
                        "id": entry_id,
                        "at": entry.at,
                        "actor": entry.actor,
                        "action": entry.action,
                        "namespace": entry.namespace,
                        "refs": json.dumps(entry.refs, separators=(",", ":")),
                        "outcome": entry.outcome,
                        "prev_hash": prev,
                        "hash": digest,
                    },
                )
                ids.append(entry_id)
                prev = digest
        return ids

    def record(self, scope: AuditScope) -> None:
        """Store the entries of a finished operation: at once on this connection when its write
        lock comes within ``LOCK_WAIT_MS``, else through the writer thread (see the module
        docstring). Call it from the thread that uses this store's connection."""
        entries = scope.entries()
        if self.db.path is None:
            self.append(entries)  # nothing else can reach an in-memory store
            return
        writer = self._writer
        if writer is not None and writer.busy:
            # Earlier entries of this store still wait in the writer's queue: these follow them,
            # so a store's entries keep their order in the chain.
            self.submit(entries)
            return
        short_wait = not self.db.in_transaction  # inside the caller's transaction: its lock is held
        try:
            with self.db.lock_wait(LOCK_WAIT_MS) if short_wait else nullcontext():
                self.append(entries)
            return
        except (sa.exc.DBAPIError, StoreUnavailableError) as exc:
            # Locked past the short wait (or the disk refused the write, or the database is away):
            # the operation itself succeeded or failed on its own; the writer thread keeps the
            # entry and retries.
            log.debug("audit: handing %d entries to the writer thread: %s", len(entries), exc)
        self.submit(entries)

    def submit(self, entries: Sequence[PendingEntry]) -> None:
        """Queue entries for the writer thread (its own connection); no wait, no lock of the store."""
        with self._writer_lock:
            if self._writer is None:
                if self.db.path is None:
                    raise AuditChainError("an in-memory store has no second connection to write its audit from")
                self._writer = AuditWriter(lambda: AuditLog(self.db.reopen()))
        self._writer.submit(entries)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued entry is stored; False if ``timeout_s`` passed first."""
        writer = self._writer
        return True if writer is None else writer.flush(timeout_s)

    def close(self) -> None:
        """Store what is queued and stop the writer."""
        with self._writer_lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    # ------------------------------------------------------------------ reading

    def entries(
        self,
        actor: str | None = None,
        namespace: str | None = None,
        since: datetime | None = None,
        limit: int | None = None,
    ) -> list[AuditEntry]:
        """Entries in chain order, of one actor (key id), namespace, from a time on."""
        where: list[str] = []
        params: dict[str, str | int] = {}
        for column, value in (("actor", actor), ("namespace", namespace)):
            if value is not None:
                where.append(f"{column} = :{column}")
                params[column] = value
        if since is not None:
            where.append("at >= :since")
            params["since"] = since.isoformat()
        sql = "SELECT * FROM audit_log" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        if limit is not None:
            sql += " LIMIT :limit"
            params["limit"] = limit
        return [_entry(row) for row in self.db.execute(sql, params)]

    def verify(self) -> Verdict:
        """Walk the chain from its anchor; the first entry that is missing, edited or out of place."""
        anchor = self.db.execute("SELECT through_id, hash FROM audit_anchor WHERE id = 1").fetchone()
        anchor_id, prev = tuple(anchor) if anchor is not None else (0, GENESIS)
        expected_id, count = anchor_id + 1, 0

        def bad(entry_id: int, problem: str) -> Verdict:
            return Verdict(
                ok=False, entries=count, anchor_id=anchor_id, head_hash=prev, first_bad_id=entry_id, problem=problem
            )

        for row in self.db.execute(
            "SELECT id, at, actor, action, namespace, refs, outcome, prev_hash, hash FROM audit_log ORDER BY id"
        ):
            entry_id, at, actor, action, namespace, refs, outcome, prev_hash, digest = row
            if entry_id < expected_id:
                return bad(entry_id, f"entry {entry_id} lies before the anchor (trimmed through {anchor_id})")
            if entry_id > expected_id:
                missing = f"{expected_id}" if entry_id == expected_id + 1 else f"{expected_id}-{entry_id - 1}"
                return bad(expected_id, f"entry {missing} is missing (deleted); entry {entry_id} follows")
            try:
                recomputed = entry_hash(entry_id, at, actor, action, namespace, json.loads(refs), outcome, prev_hash)
            except (TypeError, ValueError):
                recomputed = None
            if recomputed != digest:
                return bad(entry_id, f"entry {entry_id} does not match its hash: edited, or moved from elsewhere")
            if prev_hash != prev:
                return bad(
                    entry_id,
                    f"entry {entry_id} does not follow entry {entry_id - 1}: its prev_hash is another entry's "
                    "(entries reordered, or one before it replaced)",
                )
            prev, expected_id, count = digest, entry_id + 1, count + 1
        return Verdict(ok=True, entries=count, anchor_id=anchor_id, head_hash=prev)

    # ------------------------------------------------------------------ retention

    def trim(self, before: datetime, actor: str | None = None) -> int:
        """Remove the entries older than ``before`` (the oldest ones, in chain order, up to the
        first newer one), keeping the hash of the last one removed as the anchor that
        verification starts from, and record the trim as an entry. Refused (AuditChainError,
        nothing removed) when the chain does not verify: a trim must not hide tampering."""
        verdict = self.verify()
        if not verdict.ok:
            raise AuditChainError(f"the audit chain does not verify, not trimming it: {verdict.problem}")
        with self.db.transaction() as c:
            newer = c.scalar("SELECT min(id) FROM audit_log WHERE at >= :before", {"before": before.isoformat()})
            if newer is None:  # every entry is older
                last = c.execute("SELECT id, hash FROM audit_log ORDER BY id DESC LIMIT 1").fetchone()
            else:
                last = c.execute(
                    "SELECT id, hash FROM audit_log WHERE id < :newer ORDER BY id DESC LIMIT 1", {"newer": newer}
                ).fetchone()
            if last is None:
                trimmed = 0
            else:
                through_id, through_hash = last
                c.execute(
                    "INSERT INTO audit_anchor (id, through_id, hash, at) VALUES (1, :through_id, :hash, :at) "
                    "ON CONFLICT (id) DO UPDATE SET through_id = excluded.through_id, hash = excluded.hash, "
                    "at = excluded.at",
                    {"through_id": through_id, "hash": through_hash, "at": utcnow().isoformat()},
                )
                trimmed = c.execute(
                    "DELETE FROM audit_log WHERE id <= :through_id", {"through_id": through_id}
                ).rowcount
            scope = AuditScope(actor=actor or ACTOR.get() or _LOCAL_ACTOR, action="audit.trim")
            scope.note(None, trimmed=[trimmed], before=[before.isoformat()])
            self.append(scope.entries())
        return trimmed


def _entry(result_row: sa.Row[Any]) -> AuditEntry:
    row = result_row._mapping
    return AuditEntry(
        id=row["id"],
        at=row["at"],
        actor=row["actor"],
        action=row["action"],
        namespace=row["namespace"],
        refs=json.loads(row["refs"]),
        outcome=row["outcome"],
        prev_hash=row["prev_hash"],
        hash=row["hash"],
    )


class AuditWriter:
    """One thread appending queued entries, each batch in one short transaction on its own
    connection (opened by ``open_log`` in that thread)."""

    def __init__(self, open_log: Callable[[], AuditLog]):
        self._open_log = open_log
        self._queue: list[PendingEntry] = []
        self._in_flight = 0
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()

    def submit(self, entries: Sequence[PendingEntry]) -> None:
        with self._cond:
            # Back-pressure rather than loss when the disk stopped taking writes.
            self._cond.wait_for(lambda: len(self._queue) < MAX_QUEUED or not self._thread.is_alive())
            self._queue.extend(entries)
            self._cond.notify_all()

    @property
    def busy(self) -> bool:
        """Entries are queued or being written."""
        with self._cond:
            return bool(self._queue or self._in_flight)

    def flush(self, timeout_s: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: (not self._queue and not self._in_flight) or not self._thread.is_alive(), timeout_s
            )

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        audit: AuditLog | None = None
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._queue or self._closing)
                    if not self._queue:
                        return  # closing, and nothing left
                    batch, self._queue = self._queue, []
                    self._in_flight = len(batch)
                try:
                    if audit is None:
                        audit = self._open_log()
                    audit.append(batch)
                except Exception:  # noqa: BLE001 - e.g. the store locked past its timeout: keep them, retry
                    with self._cond:
                        self._in_flight = 0
                        if self._closing:  # the store is going away: say what is lost rather than hang
                            log.exception("audit: cannot append %d entries at close; they are lost", len(batch))
                            return
                        log.exception("audit: cannot append %d entries; retrying", len(batch))
                        self._queue[:0] = batch
                        self._cond.wait(RETRY_S)
                    continue
                with self._cond:
                    self._in_flight = 0
                    self._cond.notify_all()
        finally:
            if audit is not None:
                audit.db.close()
            with self._cond:
                self._cond.notify_all()
