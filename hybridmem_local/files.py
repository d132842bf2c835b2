"""File-system helpers shared by everything that writes next to the store."""

from __future__ import annotations

from pathlib import Path


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
