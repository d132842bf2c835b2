"""An on-disk cache of LLM calls, so re-running a stage (or a killed run) costs no model calls.

The key is the SHA-256 of everything that changes a reply: model id, prompt version, messages,
output JSON schema, sampling settings, token budget, thinking switch and tag. Only successful
results are stored. Misses go to the wrapped backend in chunks and each chunk is committed as
soon as it returns, so a run killed half-way resumes where it stopped. The file is SQLite in
WAL mode, created readable by its owner only (it holds conversation text).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from hybridmem_local.errors import InvalidInputError
from hybridmem_local.files.paths import create_owner_only
from hybridmem_local.llm.base import LLMRequest, LLMResult, StructuredLLM
from hybridmem_local.llm.replies import check_reply, schema_json
from hybridmem_local.storage import encryption
from hybridmem_local.storage.encryption import StoreKeys
from hybridmem_local.storage.scrub import retry_pending, scrub

_SCHEMA = """
CREATE TABLE IF NOT EXISTS llm_calls (
    key TEXT PRIMARY KEY,
    tag TEXT,
    model_id TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    text TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    latency_s REAL NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS llm_calls_tag ON llm_calls(tag);
"""


class CachedLLM:
    """Wraps any :class:`StructuredLLM`; itself a ``StructuredLLM`` with the same ``model_id``."""

    def __init__(
        self,
        inner: StructuredLLM,
        path: Path,
        *,
        settings: Mapping[str, Any] | None = None,
        chunk_size: int = 32,
        owns_inner: bool = False,
        keys: StoreKeys | None = None,
    ):
        """``settings``: the backend's sampling settings (see ``llm.sampling_settings``), keyed
        in; ``chunk_size``: misses sent to ``inner`` per call, the most a kill can lose;
        ``owns_inner``: ``close`` closes ``inner`` too (``build_llm`` built both); ``keys``:
        the store's keys when it is encrypted (the cache holds its turn text, so it is too)."""
        if chunk_size < 1:
            raise InvalidInputError(f"chunk_size must be >= 1, got {chunk_size}")
        self.inner = inner
        self.owns_inner = owns_inner
        self.model_id = inner.model_id
        self.path = Path(path)
        self.settings = dict(settings or {})
        self.chunk_size = chunk_size
        self.keys = keys
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            create_owner_only(self.path)
        # `hybridmem serve` calls it from its worker and ask threads, one call at a time
        # (service.state.SerializedLLM): the connection must not be tied to the creating thread.
        self._db = encryption.connect(self.path, keys, check_same_thread=False)
        encryption.use_wal(self._db)
        # forget() promises the text is gone, not just unlinked from the table.
        self._db.execute("PRAGMA secure_delete=ON")
        self._db.executescript(_SCHEMA)

    def key(self, request: LLMRequest) -> str:
        material = {
            "model_id": self.model_id,
            "prompt_version": request.prompt_version,
            "messages": [message.model_dump() for message in request.messages],
            "schema": schema_json(request.output_schema) if request.output_schema else None,
            "settings": self.settings,
            "max_new_tokens": request.max_new_tokens,
            "enable_thinking": request.enable_thinking,
            "tag": request.tag,
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode("utf-8")).hexdigest()

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        keys = [self.key(request) for request in requests]
        results: dict[int, LLMResult] = {}
        for i, (key, request) in enumerate(zip(keys, requests, strict=True)):
            if (cached := self._lookup(key, request)) is not None:
                results[i] = cached
        misses = [i for i in range(len(requests)) if i not in results]
        for start in range(0, len(misses), self.chunk_size):
            chunk = misses[start : start + self.chunk_size]
            fresh = self.inner.generate([requests[i] for i in chunk])
            with self._db:  # one commit per chunk: what returned is kept if the run dies next
                for i, result in zip(chunk, fresh, strict=True):
                    results[i] = result
                    if result.ok:
                        self._store(keys[i], requests[i], result)
        return [results[i] for i in range(len(requests))]

    def _lookup(self, key: str, request: LLMRequest) -> LLMResult | None:
        start = time.perf_counter()
        row = self._db.execute(
            "SELECT text, prompt_tokens, completion_tokens FROM llm_calls WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            return None
        text, prompt_tokens, completion_tokens = row
        parsed, problem = check_reply(text, request.output_schema)
        if problem is not None:
            return None  # a validator changed while the JSON schema did not: ask again
        return LLMResult(
            text=text,
            parsed=parsed,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_s=time.perf_counter() - start,
            cached=True,
        )

    def _store(self, key: str, request: LLMRequest, result: LLMResult) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO llm_calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key,
                request.tag,
                self.model_id,
                request.prompt_version,
                result.text,
                result.prompt_tokens,
                result.completion_tokens,
                result.latency_s,
                datetime.now(timezone.utc).isoformat(),
            ),
        )

    def forget(self, tag: str) -> int:
        """Delete every entry filed under ``tag`` (e.g. a namespace); returns how many."""
        return forget_tag(self.path, tag, self.keys).deleted

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM llm_calls").fetchone()[0]

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def close(self) -> None:
        self._db.close()
        if self.owns_inner:
            self.inner.close()

    def __enter__(self) -> CachedLLM:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class ForgottenTag(NamedTuple):
    deleted: int
    #: False: another connection's read kept the deleted entries in the WAL; the scrub is
    #: pending (``storage/scrub.py``) and retried by ``retry_pending_scrub``.
    scrubbed: bool


def forget_tag(path: Path, tag: str, keys: StoreKeys | None = None, busy_timeout_s: float = 5.0) -> ForgottenTag:
    """Delete a tag's entries from a cache file without building a backend (``forget(namespace)``),
    then scrub the file as the store is scrubbed (checkpoint, VACUUM, checked checkpoint; each
    waiting up to ``busy_timeout_s`` for other connections)."""
    if not Path(path).exists():
        return ForgottenTag(0, True)
    db = encryption.connect(path, keys, timeout=busy_timeout_s)
    try:
        db.execute("PRAGMA secure_delete=ON")
        with db:
            deleted = db.execute("DELETE FROM llm_calls WHERE tag = ?", (tag,)).rowcount
        result = scrub(db, Path(path))
    finally:
        db.close()
    return ForgottenTag(deleted, result.done)


def retry_pending_scrub(path: Path, keys: StoreKeys | None = None) -> bool | None:
    """Scrub the cache file again if a forget left its scrub pending: True when it is done now,
    False when still pending, None when none was pending."""
    result = retry_pending(Path(path), keys)
    return None if result is None else result.done
