"""Scrubbing a SQLite file after deletes, so no deleted text is left in it or in its WAL.

Deleting rows is not erasing them: until a checkpoint the WAL still holds the pages as they
were, and a VACUUM's new pages wait in the WAL while the file keeps the old ones. The recipe
measured in docs/design/encryption-at-rest.md §4 (with ``secure_delete`` on, as on every
connection the store opens): ``wal_checkpoint(TRUNCATE)`` → ``VACUUM`` → ``wal_checkpoint(TRUNCATE)``,
and the last checkpoint must return ``(0, 0, 0)``. Anything else means another connection
(any process) still reads an older snapshot, and the WAL keeps the deleted text until it ends:
then the scrub is *pending*, never reported done. A ``<file>.scrub-pending`` marker (empty)
records that, so a later call — the service worker when idle, the next open of the file —
runs the recipe again without waiting and removes the marker once it succeeds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridmem_local.errors import StoreError
from hybridmem_local.files.paths import create_owner_only
from hybridmem_local.storage import encryption
from hybridmem_local.storage.paths import pending_marker

log = logging.getLogger(__name__)

#: Final checkpoints tried before a scrub is pending; each waits the connection's busy timeout.
CHECKPOINT_ATTEMPTS = 2


@dataclass(frozen=True)
class ScrubResult:
    """What :func:`scrub` achieved on one file."""

    #: The WAL was checkpointed and truncated after the VACUUM: no deleted row is left in the
    #: file, its WAL or its freed pages. False: pending (``reason`` says why), retried later.
    done: bool
    #: The last ``PRAGMA wal_checkpoint(TRUNCATE)`` result: (busy, WAL frames, frames checkpointed).
    checkpoint: tuple[int, int, int]
    reason: str | None = None


def is_pending(path: Path | None) -> bool:
    return path is not None and pending_marker(path).exists()


def scrub(conn: Any, path: Path | None, *, wait: bool = True) -> ScrubResult:
    """Run the scrub recipe on ``conn`` (the connection of ``path``; None for ``:memory:``).

    ``wait``: checkpoints wait for readers up to the connection's busy timeout (forget); a
    retry of a pending scrub (``wait=False``) does not wait, so it never holds up its caller.
    Must not run inside a transaction (VACUUM cannot)."""
    if conn.in_transaction:
        raise StoreError("scrub runs after the deleting transaction committed, not inside it")
    timeout_ms = conn.execute("PRAGMA busy_timeout").fetchone()[0]
    try:
        # The first checkpoint only moves committed frames into the file before VACUUM reads it:
        # a reader blocking it is dealt with by the last one, so it never waits.
        conn.execute("PRAGMA busy_timeout = 0")
        _checkpoint_once(conn)
        conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms) if wait else 0}")
        try:
            conn.execute("VACUUM")
        except encryption.OperationalError as exc:  # a writer's lock outlasted the wait, or the disk is full
            result = ScrubResult(False, (1, -1, -1), f"VACUUM failed: {exc}")
        else:
            result = _checkpoint(conn, CHECKPOINT_ATTEMPTS if wait else 1)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")
    _record(path, result)
    return result


def _checkpoint_once(conn: Any) -> tuple[int, int, int]:
    try:
        busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except encryption.OperationalError:  # locked by a writer past the wait: as busy as a reader
        return (1, -1, -1)
    return (int(busy), int(frames), int(copied))


def _checkpoint(conn: Any, attempts: int) -> ScrubResult:
    last = (1, -1, -1)
    for _ in range(attempts):
        last = busy, frames, copied = _checkpoint_once(conn)
        # (0, 0, 0) after TRUNCATE in WAL mode; (0, -1, -1) when the file is not in WAL mode (no WAL).
        if busy == 0 and frames == copied and frames <= 0:
            return ScrubResult(True, last)
    return ScrubResult(
        False, last, f"another connection still reads an older snapshot (wal_checkpoint(TRUNCATE) returned {last})"
    )


def _record(path: Path | None, result: ScrubResult) -> None:
    if path is None:
        return
    marker = pending_marker(path)
    if result.done:
        marker.unlink(missing_ok=True)
        return
    create_owner_only(marker)
    log.warning(
        "scrub of %s pending: deleted content stays in its WAL until %s; retried when the service is idle "
        "and at the next open",
        path,
        result.reason,
    )


def retry_pending(path: Path, keys: encryption.StoreKeys | None) -> ScrubResult | None:
    """Scrub ``path`` again if a scrub of it is pending (its own short-lived connection, no
    waiting); None when none was pending."""
    if not is_pending(path):
        return None
    if not path.exists():  # the file itself is gone: nothing left to scrub
        pending_marker(path).unlink(missing_ok=True)
        return None
    conn = encryption.connect(path, keys, isolation_level=None)
    try:
        conn.execute("PRAGMA secure_delete = ON")
        return scrub(conn, path, wait=False)
    finally:
        conn.close()
