"""The files of a store, all named after its database file ``<db>``.

* ``<db>`` with SQLite's ``<db>-wal`` and ``<db>-shm`` (:func:`database_files`);
* ``<db>.llm_cache.sqlite``: the LLM call cache (:func:`llm_cache_path`);
* ``<db>.indexes/``: the index files, a cache of the store (:func:`indexes_path`);
* ``<db>.keyid``: the public id of the key an encrypted store is encrypted with (:func:`keyid_path`);
* ``<db>.forgotten-seen``: the last forget (of any process) this host removed its local copies for
  (:func:`forgotten_seen_path`);
* ``<file>.scrub-pending``: the database or the cache still holds deleted text in its WAL
  (:func:`pending_marker`).

Exports are written where the user says; the ``exports`` table records them.
"""

from __future__ import annotations

from pathlib import Path


def database_files(path: Path) -> list[Path]:
    """The database file and the two SQLite keeps beside it in WAL mode."""
    return [Path(str(path) + suffix) for suffix in ("", "-wal", "-shm")]


def llm_cache_path(path: Path) -> Path:
    """The LLM call cache beside the store (``HybridMemory.llm``)."""
    return Path(str(path) + ".llm_cache.sqlite")


def indexes_path(path: Path) -> Path:
    """The folder of the store's index files (``indexes/store_indexes.py``)."""
    return Path(str(path) + ".indexes")


def keyid_path(path: Path) -> Path:
    """The sidecar naming the key id an encrypted database (or cache) was encrypted with."""
    return Path(str(path) + ".keyid")


def forgotten_seen_path(path: Path) -> Path:
    """The last forget tombstone this host has swept its local files for (``memory/erasure.py``)."""
    return Path(str(path) + ".forgotten-seen")


def pending_marker(path: Path) -> Path:
    """The empty file that says ``path`` still holds deleted text in its WAL (it holds none)."""
    return Path(str(path) + ".scrub-pending")
