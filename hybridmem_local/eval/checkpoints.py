"""Memory checkpoints: each evaluation store's memories, written into the results folder as
curation and consolidation make them, so a run resumes on another machine (one that has the
results folder but not the stores or the LLM cache) without asking the LLM again.

    OUT/memories/<store>.jsonl    a header, each session's curation status, then every memory (any status)

The turns are never written: they are the benchmark's data, not a result (and not to be
copied into a repository); the memories are what the LLM made of them. The header holds the
checkpoint's key (what curation and consolidation depend on: the config and the prompt
versions) and, for a consolidated copy, what it was made from (the curated store's counts) and
its consolidation report. A missing store is rebuilt from its checkpoint: the sessions as the
run has just stored them, with the recorded statuses, and the memories imported with their
ids mapped (``HybridMemory.import_``); the sessions still pending are curated as usual.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridmem_local.errors import DatasetError
from hybridmem_local.files.paths import owner_only_opener

if TYPE_CHECKING:
    from collections.abc import Callable

    from hybridmem_local.memory import HybridMemory

log = logging.getLogger(__name__)

#: The folder of a results folder that holds the checkpoints.
MEMORIES = "memories"


class Checkpoint:
    """One store's checkpoint as read back: its header, session statuses and memory lines."""

    def __init__(self, header: dict[str, Any], statuses: dict[str, dict[str, Any]], memory_lines: list[str]):
        self.header = header
        self.statuses = statuses
        self.memory_lines = memory_lines


def checkpoint_path(out: Path, store_path: Path) -> Path:
    return out / MEMORIES / f"{store_path.stem}.jsonl"


def write_checkpoint(memory: HybridMemory, namespace: str, path: Path, key: str, **header: Any) -> None:
    """Replace ``path`` with the namespace's checkpoint, atomically: a run killed while writing
    leaves the previous one whole."""
    lines = [json.dumps({"type": "checkpoint", "key": key, "namespace": namespace, **header}) + "\n"]
    for line in memory.export_records(namespace):
        record = json.loads(line)
        if record["type"] == "session":
            lines.append(
                json.dumps(
                    {
                        "type": "session_status",
                        "session_id": record["session"]["session_id"],
                        "curation_status": record["curation_status"],
                        "curation_error": record["curation_error"],
                    }
                )
                + "\n"
            )
        else:
            lines.append(line)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8", opener=owner_only_opener) as out:
        out.writelines(lines)
    os.replace(partial, path)


def read_checkpoint(path: Path, key: str) -> Checkpoint | None:
    """The checkpoint at ``path`` when there is one made under ``key``; None otherwise (one made
    under another config or prompt is not this run's: it is logged and left alone)."""
    if not path.exists():
        return None
    header: dict[str, Any] | None = None
    statuses: dict[str, dict[str, Any]] = {}
    memory_lines: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
            kind = record["type"]
            if kind == "checkpoint":
                header = record
            elif kind == "session_status":
                statuses[record["session_id"]] = record
            elif kind == "memory":
                memory_lines.append(line + "\n")
            else:
                raise KeyError(kind)
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DatasetError(f"{path}: line {number} is not a checkpoint record ({exc!r})") from None
    if header is None:
        raise DatasetError(f"{path}: no checkpoint header (its first line)")
    if header["key"] != key:
        log.warning("%s was made under another config or prompt (key %s, not %s): not used", path, header["key"], key)
        return None
    return Checkpoint(header, statuses, memory_lines)


def session_lines(memory: HybridMemory, namespace: str) -> list[str]:
    """The session records (with their turns) of the namespace's export: what a rebuilt store holds."""
    return [line for line in memory.export_records(namespace) if json.loads(line)["type"] == "session"]


def rebuild_store(
    path: Path,
    open_store: Callable[[Path], HybridMemory],
    session_lines: list[str],
    checkpoint: Checkpoint,
) -> dict[str, int]:
    """Replace the store at ``path`` by one holding ``session_lines`` (an export's session
    records: the sessions with their turns) under the checkpoint's statuses, and its memories.
    A session the checkpoint does not know stays as it is (pending: curated next)."""
    lines = []
    for line in session_lines:
        record = json.loads(line)
        status = checkpoint.statuses.get(record["session"]["session_id"])
        if status is not None:
            record["curation_status"], record["curation_error"] = status["curation_status"], status["curation_error"]
        lines.append(json.dumps(record) + "\n")
    remove_store(path)
    staging = path.with_name(path.name + ".import.jsonl")  # beside the store: it holds the turns
    with open(staging, "w", encoding="utf-8", opener=owner_only_opener) as out:
        out.writelines(lines + checkpoint.memory_lines)
    try:
        with open_store(path) as memory:
            return memory.import_(staging)
    finally:
        staging.unlink()


def remove_store(path: Path) -> None:
    """Delete a SQLite store and everything kept beside it (journal, indexes, LLM cache)."""
    from hybridmem_local.storage.paths import indexes_path, llm_cache_path

    for stale in (path, Path(str(path) + "-wal"), Path(str(path) + "-shm"), llm_cache_path(path)):
        stale.unlink(missing_ok=True)
    shutil.rmtree(indexes_path(path), ignore_errors=True)
