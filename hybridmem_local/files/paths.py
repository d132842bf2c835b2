"""File-system helpers shared by everything that writes next to the store."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from pydantic import BaseModel

from hybridmem_local.files.sealing import seal, unseal


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` and any missing parents readable by their owner alone (0700).

    ``Path.mkdir(parents=True, mode=...)`` applies the mode to the leaf only, so each missing
    level is created here one by one.
    """
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)


def owner_only_opener(path: str, flags: int) -> int:
    """``open(path, mode, opener=owner_only_opener)``: a file it creates is 0600 from the start,
    never readable by others even for an instant (these files hold private conversations)."""
    return os.open(path, flags, 0o600)


def create_owner_only(path: Path, exclusive: bool = False) -> None:
    """Create ``path`` empty and 0600 when it is missing; an existing file is left as it is
    (``exclusive``: raise :class:`FileExistsError` instead)."""
    os.close(owner_only_opener(str(path), os.O_CREAT | os.O_WRONLY | (os.O_EXCL if exclusive else 0)))


#: Seconds after which an index file no manifest names is an orphan (of a crashed save, or of
#: two saves that replaced the same build), not a save in progress: a save writes its files and
#: switches the manifest within seconds, even at 100k memories.
ORPHAN_GRACE_S = 600.0


def remove_orphans(candidates: Iterable[Path], grace_s: float = ORPHAN_GRACE_S) -> int:
    """Delete the candidate files last modified more than ``grace_s`` ago; returns how many."""
    cutoff = time.time() - grace_s
    removed = 0
    for path in candidates:
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:
            pass  # another process removed it first
    return removed


#: A generation name: 12 hex digits (``uuid4().hex[:12]``), fresh for every save.
_GENERATION = "[0-9a-f]{12}"


class GenerationFiles:
    """The save protocol every index file set shares: generations committed by a manifest replace.

    A save writes a new generation's files (``file_pattern`` with the generation in ``{}``),
    then a temporary manifest naming it (``temp_pattern``), then replaces ``manifest`` with
    it. Replacing the manifest is the single commit point: a crash before it leaves the old
    generation in force, after it the new one; files of two generations never mix. Files are
    0600 (they hold words of private conversations).

    Several processes may save the same index at once, so a save removes at once only the
    generation it replaced; other files that no manifest names (a crashed save's, or those of
    two saves that replaced the same generation) go once they are older than ``ORPHAN_GRACE_S``.

    With a ``key`` (the store is encrypted), :meth:`write_bytes` seals every generation file
    (``files.sealing``) bound to its namespace folder, index, generation and suffix, so a file
    moved to another of these fails to open, and :meth:`read_bytes` refuses an unsealed one.
    Manifests stay plaintext: they name a model, a recipe, a count and a generation, no content.
    """

    def __init__(
        self,
        directory: Path,
        manifest: str,
        file_pattern: str,
        temp_pattern: str,
        generation_field: str,
        key: bytes | None = None,
    ):
        self.directory = directory
        self.key = key
        self.manifest_path = directory / manifest
        self._file_pattern = file_pattern
        self._temp_pattern = temp_pattern
        self._generation_field = generation_field
        # Exact patterns: the vector index "tuple.<gen>.*" must not match the BM25 index "tuple.bm25.<gen>.*".
        self._generation_file = re.compile(_regex(file_pattern))
        self._temp_manifest = re.compile(_regex(temp_pattern))

    def committed(self) -> str | None:
        """The generation the manifest names, None when there is no readable manifest."""
        try:
            generation = json.loads(self.manifest_path.read_text())[self._generation_field]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return generation if isinstance(generation, str) else None

    def path(self, generation: str, suffix: str) -> Path:
        """The file of ``generation`` ending in ``suffix`` (e.g. ``"labels.npy"``)."""
        return self.directory / (self._file_pattern.replace("{}", generation) + suffix)

    @property
    def sealed(self) -> bool:
        return self.key is not None

    def write_bytes(self, generation: str, suffix: str, data: bytes) -> None:
        """Write one file of ``generation`` (0600 from the start), sealed when there is a key."""
        if self.key is not None:
            data = seal(self.key, self._context(generation, suffix), data)
        with open(self.path(generation, suffix), "wb", opener=owner_only_opener) as out:
            out.write(data)

    def read_bytes(self, generation: str, suffix: str) -> bytes:
        """One file of ``generation``, unsealed when there is a key (``SealError`` when it is not
        sealed, damaged, or sealed for another file)."""
        data = self.path(generation, suffix).read_bytes()
        return unseal(self.key, self._context(generation, suffix), data) if self.key is not None else data

    def _context(self, generation: str, suffix: str) -> str:
        # The folder is the namespace: a file copied into another namespace's folder fails.
        return f"hybridmem/index/v1|{self.directory.name}|{self._file_pattern}|{generation}|{suffix}"

    def files(self) -> list[Path]:
        """The manifest and every generation or temporary file of this index on disk."""
        if not self.directory.exists():
            return []
        return sorted(
            p
            for p in self.directory.iterdir()
            if p == self.manifest_path or self._generation_file.match(p.name) or self._temp_manifest.fullmatch(p.name)
        )

    def delete(self) -> None:
        for path in self.files():
            path.unlink(missing_ok=True)

    def save(self, write: Callable[[str], None], manifest: Callable[[str], BaseModel]) -> str:
        """Write a new generation (``write(generation)`` writes its files) and commit it."""
        ensure_private_dir(self.directory)
        generation = uuid.uuid4().hex[:12]
        write(generation)
        temp = self.directory / self._temp_pattern.replace("{}", generation)  # unique: processes may save at once
        temp.write_text(manifest(generation).model_dump_json())
        for path in self._files_of(generation) + [temp]:
            os.chmod(path, 0o600)
        replaced = self.committed()
        os.replace(temp, self.manifest_path)
        if replaced is not None and replaced != generation:
            for path in self._files_of(replaced):
                path.unlink(missing_ok=True)
        current = self.committed()
        remove_orphans(
            p
            for p in self.files()
            if p != self.manifest_path and not (current is not None and p in self._files_of(current))
        )
        return generation

    def _files_of(self, generation: str) -> list[Path]:
        prefix = self._file_pattern.replace("{}", generation)
        return [p for p in self.files() if p.name.startswith(prefix)]


def _regex(pattern: str) -> str:
    before, after = pattern.split("{}")
    return re.escape(before) + _GENERATION + re.escape(after)
