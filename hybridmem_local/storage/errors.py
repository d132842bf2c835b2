"""What the store raises: a write it refused (nothing was changed) or a row that is not there."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The database cannot be opened or a write was refused; nothing was changed."""


class NotFoundError(KeyError):
    pass


class DuplicateSessionError(StoreError):
    """The session id is already stored in that namespace (e.g. by a concurrent ingest)."""


class AlreadyCuratedError(DuplicateSessionError):
    """The session was curated meanwhile (by another process): its memories are stored once, not twice."""
