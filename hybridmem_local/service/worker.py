"""The curation worker of ``hybridmem serve``: pending sessions in, memories out, off the request path.

The queue is the store: a session added through the service is a ``pending`` row (raw turns
committed before the client got its 202), so a crash or restart loses nothing; the next worker
simply finds the rows again. Each round the worker claims up to ``curation.batch_sessions``
pending sessions of *all* namespaces, oldest first, and curates them with one batched LLM call
(many clients' sessions share a batch: what vLLM's continuous batching needs to pay off). Each
session's memories and its ``curated`` status commit in one transaction, a failed session
becomes ``curation_failed`` (raw turns kept, retried with ``hybridmem curate --retry-failed``),
and a session another process curated meanwhile is skipped, never stored twice. Then scheduled
consolidation (``consolidation.every_n_sessions``) runs for the namespaces the batch touched.

Several workers share one queue (in one ``hybridmem serve``, in ``hybridmem worker`` processes,
on any host of a PostgreSQL store): a claim names its worker and lasts
``service.claim_lease_s``, renewed every third of it by a heartbeat thread while the batch runs.
Workers skip sessions another holds (on PostgreSQL with ``FOR UPDATE SKIP LOCKED``); a worker
killed mid-batch stops renewing, and once its lease runs out another worker takes its sessions.
A session whose curation two workers both finished (the first one's lease ran out while its
LLM still worked) is stored once: the second finds it curated and skips it.

The worker wakes on ``wake()`` (the service calls it after storing sessions) or every
``service.worker_poll_s``. When idle it also finishes a forget's scrub that another
connection's read held up (``HybridMemory.retry_pending_scrubs``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from hybridmem_local.config import Config
from hybridmem_local.embedding import Embedder
from hybridmem_local.errors import StoreUnavailableError, WorkerStopped
from hybridmem_local.llm.base import LLMRequest, LLMResult, StructuredLLM
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import Session, utcnow
from hybridmem_local.storage.audit import acting_as
from hybridmem_local.storage.store import MemoryStore

log = logging.getLogger(__name__)

#: How long ``stop`` waits for the batch in flight. Its writes take milliseconds; only an LLM
#: call (minutes on a CPU) outlasts this, and that batch is abandoned: its sessions stay pending.
STOP_WAIT_S = 10.0


class WorkerStatus(BaseModel):
    model_config = ConfigDict(extra="forbid")

    running: bool
    #: Sessions waiting for curation, all namespaces.
    pending: int
    batches: int
    sessions_curated: int
    sessions_failed: int
    #: Sessions found curated by another process when their turn came.
    sessions_skipped: int
    memories: int
    consolidation_runs: int
    last_batch_at: datetime | None
    last_error: str | None


class _StoppableLLM:
    """The shared LLM as the worker sees it: once the worker is abandoned, a call raises
    WorkerStopped instead of returning, so no result of an abandoned batch is ever written."""

    def __init__(self, llm: StructuredLLM, abandoned: threading.Event):
        self._llm = llm
        self._abandoned = abandoned

    @property
    def model_id(self) -> str:
        return self._llm.model_id

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        if self._abandoned.is_set():
            raise WorkerStopped("the worker was stopped before this LLM call")
        results = self._llm.generate(requests)
        if self._abandoned.is_set():
            raise WorkerStopped("the worker was stopped during this LLM call; its results are dropped")
        return results

    def count_tokens(self, text: str) -> int:
        return self._llm.count_tokens(text)

    def close(self) -> None:
        """Nothing: the shared LLM is the service's to close (``ServiceState.close``)."""


class CurationWorker:
    """A thread curating pending sessions in batches; see the module docstring."""

    def __init__(self, db: Path, config: Config, embedder: Embedder, llm: StructuredLLM):
        self.config = config
        #: Names this worker's claims: unique per worker, readable in the sessions table.
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._abandoned = threading.Event()
        self.memory = HybridMemory(
            MemoryStore.open(db, config.store), config, embedder, _StoppableLLM(llm, self._abandoned)
        )
        # status() is called from request threads; a connection of its own keeps its reads out
        # of the worker's transactions.
        self._status_store = MemoryStore.open(db, config.store)
        self._status_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._batches = self._curated = self._failed = self._skipped = self._memories = self._runs = 0
        self._last_batch_at: datetime | None = None
        self._last_error: str | None = None

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the curation worker was started already")
        self._thread = threading.Thread(target=self._run, name="curation-worker", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look for pending sessions now instead of at the next poll."""
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, wait_s: float = STOP_WAIT_S) -> bool:
        """Stop after the batch in flight; True when the thread ended within ``wait_s``.

        False means the batch was abandoned inside its LLM call: the thread ends when that call
        returns, writing nothing, and the batch's sessions stay pending for the next start.
        """
        self._stop.set()
        self._wake.set()
        if self._thread is None:
            return True
        self._thread.join(wait_s)
        if self._thread.is_alive():
            self._abandoned.set()
            log.warning(
                "curation worker: the batch in flight did not finish within %.0fs; abandoned, "
                "its sessions stay pending",
                wait_s,
            )
            return False
        return True

    def close(self, wait_s: float = STOP_WAIT_S) -> bool:
        """Stop, then close the worker's store (left open if an abandoned call may still return)."""
        stopped = self.stop(wait_s)
        if stopped:
            self.memory.close()
        with self._status_lock:
            self._status_store.close()
        return stopped

    def status(self) -> WorkerStatus:
        with self._status_lock:
            pending = self._status_store.sessions.count("pending")
        return WorkerStatus(
            running=self.alive,
            pending=pending,
            batches=self._batches,
            sessions_curated=self._curated,
            sessions_failed=self._failed,
            sessions_skipped=self._skipped,
            memories=self._memories,
            consolidation_runs=self._runs,
            last_batch_at=self._last_batch_at,
            last_error=self._last_error,
        )

    # ------------------------------------------------------------------ work

    def _run(self) -> None:
        with acting_as("worker"):  # the audit trail names the worker as who curated
            self._loop()

    def _loop(self) -> None:
        poll_s = self.config.service.worker_poll_s
        while not self._stop.is_set():
            try:
                worked = self.run_once()
            except WorkerStopped:
                return
            except Exception as exc:  # noqa: BLE001 - e.g. the store is locked past its timeout: retry later
                log.exception("curation worker: cannot read the queue")
                self._last_error = f"{type(exc).__name__}: {exc}"
                worked = False
            if not worked:
                self.retry_pending_scrubs()
                self._wake.wait(poll_s)
                self._wake.clear()

    def retry_pending_scrubs(self) -> None:
        """When idle: finish a forget's scrub that a reader held up (``HybridMemory.retry_pending_scrubs``).
        Asked first whether one is pending, so an idle poll leaves no audit entry."""
        try:
            if not self.memory.scrub_pending or self.memory.retry_pending_scrubs() == 0:
                return
            log.info("curation worker: a forget's scrub is still pending (another connection reads); retried next poll")
        except Exception:  # noqa: BLE001 - e.g. the store is locked past its timeout: the next poll retries
            log.exception("curation worker: cannot retry a pending scrub")

    def run_once(self) -> bool:
        """Curate one batch; False when nothing was pending or the batch failed as a whole
        (the loop then waits a poll before the next round)."""
        lease_s = self.config.service.claim_lease_s
        sessions = self.memory.claim_sessions(self.name, self.config.curation.batch_sessions, lease_s)
        if not sessions:
            return False
        try:
            with self._heartbeat(lease_s):
                report = self.memory.curate_stored(sessions)
        except WorkerStopped:
            self._release_claims()
            raise
        except StoreUnavailableError as exc:
            # The database went away mid-batch: what was not committed was rolled back whole;
            # the sessions stay pending (not failed) and are claimed again once it is back.
            log.warning("curation worker: the store went away mid-batch (%s); its sessions stay pending", exc)
            self._last_error = f"{type(exc).__name__}: {exc}"
            self._release_claims()
            return False
        except Exception as exc:  # noqa: BLE001 - whatever it was, the sessions must not loop forever
            self._fail_batch(sessions, exc)
            self._release_claims()
            return False
        self._batches += 1
        self._curated += report.curated
        self._failed += report.failed
        self._skipped += report.skipped
        self._memories += report.memories
        self._runs += len(report.consolidation_runs)
        self._last_batch_at = utcnow()
        log.info(
            "curation worker: batch of %d session(s) from %d namespace(s): %d curated, %d failed, %d memories, "
            "%d LLM requests in %.1fs of model time",
            len(sessions),
            len({s.namespace for s in sessions}),
            report.curated,
            report.failed,
            report.memories,
            report.usage.requests,
            report.usage.llm_s,
        )
        return True

    @contextmanager
    def _heartbeat(self, lease_s: float) -> Iterator[None]:
        """Renew the batch's claims every third of the lease while the block runs (its own
        connection: the worker's is busy with the batch)."""
        done = threading.Event()

        def renew() -> None:
            while not done.wait(lease_s / 3):
                try:
                    with self._status_lock:
                        self._status_store.sessions.renew_claims(self.name, lease_s)
                except Exception:  # noqa: BLE001 - a missed renewal only shortens the claim
                    log.exception("curation worker: cannot renew the claims of its batch")

        thread = threading.Thread(target=renew, name="curation-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _release_claims(self) -> None:
        try:
            with self._status_lock:
                self._status_store.sessions.release_claims(self.name)
        except Exception:  # noqa: BLE001 - the claims then run out by themselves
            log.exception("curation worker: cannot release the claims of its batch")

    def _fail_batch(self, sessions: Sequence[Session], exc: Exception) -> None:
        """An error outside the curator's own handling (the LLM cannot be built, the disk is
        full...): the batch's sessions still pending become ``curation_failed`` with it, so the
        worker moves on instead of retrying them forever; their raw turns stay."""
        error = f"{type(exc).__name__}: {exc}"
        log.exception("curation worker: batch of %d session(s) failed", len(sessions))
        self._last_error = error
        try:
            self._failed += self.memory.mark_curation_failed(sessions, error)
        except Exception:  # noqa: BLE001 - the store itself fails: the next round tries again
            log.exception("curation worker: cannot mark the batch's sessions failed")
