"""Opening a SQLite file while another connection holds its write lock, for the store and the LLM
cache alike: both put a new file in WAL mode on open (``storage.encryption.use_wal``)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def open_while_write_locked(path: Path, open_file: Callable[[], T]) -> T:
    """``open_file()`` on a thread while another connection holds the write lock of ``path``, a
    file still in rollback mode. Asserts that the opening waits for the lock (alive after 1 s,
    no error) instead of failing, and returns what it opened once the lock is released."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    opened: list[T] = []
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            opened.append(open_file())
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
            errors.append(exc)

    thread = threading.Thread(target=open_it)
    thread.start()
    thread.join(1.0)
    try:
        assert errors == [] and thread.is_alive()  # waiting for the holder's write lock
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        thread.join(30)
    assert errors == [] and len(opened) == 1
    return opened[0]
