"""File-system helpers shared by everything that writes next to the store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable


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
