"""What one ``hybridmem serve`` process holds, shared by the HTTP routes and the MCP tools.

    state = ServiceState(Path("memory.db"), config)
    state.open()                                   # embedder, stores, curation worker
    records = state.enqueue(sessions)              # raw turns stored `pending`, worker woken
    with state.memory() as memory:                 # the request-side HybridMemory, under its lock
        result = memory.search("...", namespace="alice")
    answer = state.answer("...", "alice", None, None)   # AskTimeoutError past service.ask_timeout_s
    state.close()

Threads and what they share:

* Request threads use one request-side ``HybridMemory`` under ``memory()``'s lock: its SQLite
  connection, hnswlib indexes and dict caches are not safe to use from two threads at once (two
  threads on one connection would even share a transaction).
* The curation worker has its own ``HybridMemory`` on the same file (its own connection and
  indexes); the request side sees the worker's commits through ``PRAGMA data_version``.
* Both use the same embedder and LLM objects, each behind a lock of its own (torch and llama.cpp
  objects are not thread-safe, and loading them twice would double the memory). So a request
  waits on curation only for the LLM itself (``answer``), bounded by ``service.ask_timeout_s``,
  and for one embedder call of the worker (a few memories' texts) at most.
* API keys are checked on a connection of their own, so a key lookup never lands inside a
  transaction of the request-side memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import numpy as np

from hybridmem_local.config import Config
from hybridmem_local.embedding import Embedder, build_embedder
from hybridmem_local.errors import AskTimeoutError, NotReadyError
from hybridmem_local.llm.base import LLMRequest, LLMResult, StructuredLLM
from hybridmem_local.memory import HybridMemory
from hybridmem_local.results import Answer, SessionRecord
from hybridmem_local.schema import Session
from hybridmem_local.service.keys import KeyRing
from hybridmem_local.service.worker import CurationWorker
from hybridmem_local.storage.audit import AuditEntry, AuditLog, AuditScope
from hybridmem_local.storage.encryption import load_keys
from hybridmem_local.storage.store import MemoryStore

log = logging.getLogger(__name__)

#: ``ask`` calls waiting for (or holding) the LLM at once; more queue here. The LLM serves one
#: call at a time anyway, so more threads would only wait.
ASK_THREADS = 4


class SerializedEmbedder:
    """An embedder shared by threads: one ``embed`` call at a time."""

    def __init__(self, inner: Embedder):
        self.inner = inner
        self.model_id = inner.model_id
        self.dimension = inner.dimension
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:  # nothing to compute: no reason to wait for another thread's call
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._lock:
            return self.inner.embed(texts)


class SerializedLLM:
    """The LLM shared by ``ask`` and the curation worker: one call at a time, built on first use
    (a service that is never asked and has nothing to curate never loads a model).

    Both memories of the service are given this one, so neither closes it; ``ServiceState.close``
    does, once, and it closes the model only if ``owns`` (it built the model, not the caller).
    """

    def __init__(self, build: Callable[[], StructuredLLM], owns: bool):
        self._build = build
        self._owns = owns
        self._inner: StructuredLLM | None = None
        #: Re-entrant: ``answer`` holds it across count_tokens and generate of one question.
        self.lock = threading.RLock()

    @property
    def inner(self) -> StructuredLLM:
        if self._inner is None:
            with self.lock:
                if self._inner is None:
                    self._inner = self._build()
        return self._inner

    @property
    def built(self) -> bool:
        return self._inner is not None

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        with self.lock:
            return self.inner.generate(requests)

    def count_tokens(self, text: str) -> int:
        with self.lock:
            return self.inner.count_tokens(text)

    @contextmanager
    def held(self, timeout_s: float) -> Iterator[SerializedLLM]:
        """The LLM to this thread alone, or AskTimeoutError when it stays busy past ``timeout_s``."""
        if not self.lock.acquire(timeout=max(0.0, timeout_s)):
            raise AskTimeoutError(f"the LLM stayed busy (curating, or answering others) for {timeout_s:.1f}s")
        try:
            yield self
        finally:
            self.lock.release()

    def close(self) -> None:
        with self.lock:
            if self._inner is not None and self._owns:
                self._inner.close()
            self._inner = None


class ServiceState:
    """What one ``hybridmem serve`` process holds (see the module docstring)."""

    def __init__(
        self,
        db: Path,
        config: Config,
        *,
        embedder: Embedder | None = None,
        llm: StructuredLLM | None = None,
        start_worker: bool = True,
    ):
        self.db = Path(db)
        self.config = config
        self.start_worker = start_worker
        self._given_embedder = embedder
        # A given LLM belongs to the caller (tests share one); one built here is closed here.
        self.llm = SerializedLLM((lambda: llm) if llm is not None else self._build_llm, owns=llm is None)
        self.embedder: SerializedEmbedder | None = None
        self.keys: KeyRing
        self.worker: CurationWorker
        self._memory: HybridMemory | None = None
        self._memory_lock = threading.RLock()
        self._keys_store: MemoryStore | None = None
        self._ask_pool: ThreadPoolExecutor | None = None
        self._audit: AuditLog | None = None

    def _build_llm(self) -> StructuredLLM:
        from hybridmem_local.llm.factory import store_llm

        # The store's LLM, as HybridMemory.llm builds it: the same call cache beside the store
        # (for a PostgreSQL store, in this host's folder of its local files).
        files_base = self._memory.store.path if self._memory is not None else self.db
        return store_llm(self.config.llm, files_base, load_keys(self.config.store))

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Load the embedder, open the stores and start the curation worker."""
        if self._memory is not None:
            return
        started = time.perf_counter()
        self.embedder = SerializedEmbedder(self._given_embedder or build_embedder(self.config.embedder))
        self._memory = HybridMemory(MemoryStore.open(self.db, self.config.store), self.config, self.embedder, self.llm)
        self._audit = self._memory.store.audit
        self._keys_store = MemoryStore.open(self.db, self.config.store)
        self.keys = KeyRing(self._keys_store)
        self.worker = CurationWorker(self.db, self.config, self.embedder, self.llm)
        if self.start_worker:
            self.worker.start()
        self._ask_pool = ThreadPoolExecutor(max_workers=ASK_THREADS, thread_name_prefix="ask")
        log.info(
            "service state open on %s in %.1fs (worker %s)",
            self.db,
            time.perf_counter() - started,
            "started" if self.start_worker else "off",
        )

    def close(self) -> None:
        """Stop the worker (its batch finishes within a few seconds or is abandoned, its sessions
        left pending), save the indexes and close the stores."""
        if self._memory is None:
            return
        worker_done = self.worker.close()
        if self._ask_pool is not None:
            self._ask_pool.shutdown(wait=False, cancel_futures=True)
        with self._memory_lock:
            self._audit = None
            self._memory.close()  # stores the audit entries still queued
            self._memory = None
        if self._keys_store is not None:
            self._keys_store.close()
        # An abandoned batch may still be inside the LLM: freeing the model under it could crash.
        if worker_done:
            self.llm.close()

    def __enter__(self) -> ServiceState:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def ready(self) -> bool:
        """Store open, embedder loaded and (unless it is off) the worker thread alive."""
        return self._memory is not None and self.embedder is not None and (not self.start_worker or self.worker.alive)

    # ------------------------------------------------------------------ requests

    @contextmanager
    def memory(self) -> Iterator[HybridMemory]:
        """The request-side HybridMemory, to this thread alone while the block runs."""
        with self._memory_lock:
            if self._memory is None:
                raise NotReadyError("the service state is not open")
            yield self._memory

    def record_audit(self, entry: AuditScope) -> None:
        """Store a request's audit entry: on the request-side connection when no request holds
        it (~0.1 ms), else through the store's audit writer thread, so no request waits for
        another to take its audit row."""
        audit = self._audit
        if audit is None:
            return
        if self._memory_lock.acquire(blocking=False):
            try:
                audit.record(entry)
            finally:
                self._memory_lock.release()
        else:
            audit.submit(entry.entries())

    def flush_audit(self, timeout_s: float | None = None) -> bool:
        """Wait until the audit entries queued so far are stored (tests, and ``close``)."""
        return self._audit.flush(timeout_s) if self._audit is not None else True

    def audit_entries(
        self, actor: str | None, namespace: str | None, since: datetime | None, limit: int
    ) -> list[AuditEntry]:
        """The store's audit entries, oldest first (``GET /v1/audit`` for an all-namespace admin key)."""
        with self.memory() as memory:
            return memory.store.audit.entries(actor=actor, namespace=namespace, since=since, limit=limit)

    def enqueue(self, sessions: Sequence[Session]) -> list[SessionRecord]:
        """Store sessions raw as ``pending`` in one transaction (all or none) and wake the worker
        (``HybridMemory.enqueue``: QueueFullError past ``service.max_pending_sessions``,
        DuplicateSessionError for a session id stored already; nothing stored either way)."""
        if not sessions:
            return []
        with self.memory() as memory:
            records = memory.enqueue(sessions, max_pending=self.config.service.max_pending_sessions)
        self.worker.wake()
        return records

    def answer(self, question: str, namespace: str, question_date: datetime | None, k: int | None) -> Answer:
        """Retrieve under the memory lock, then one LLM call outside it; AskTimeoutError when the
        answer is not there within ``service.ask_timeout_s`` (waiting for the LLM included)."""
        timeout_s = self.config.service.ask_timeout_s
        deadline = time.monotonic() + timeout_s
        with self.memory() as memory:
            prepared = memory.prepare_answer(question, namespace, question_date, k)
        if self._ask_pool is None:
            raise NotReadyError("the service state is not open")

        def call_llm() -> Answer:
            with self.llm.held(deadline - time.monotonic()) as llm:
                return prepared.run(llm)

        # In a thread of its own, so the caller gets its 504 on time even when the model is
        # mid-generation (which cannot be interrupted; its late answer is dropped).
        future = self._ask_pool.submit(call_llm)
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeoutError:
            raise AskTimeoutError(f"no answer within service.ask_timeout_s={timeout_s}s") from None
