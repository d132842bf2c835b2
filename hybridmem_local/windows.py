"""Evidence windows: the raw turns the store keeps, searched as ``w`` consecutive turns.

A window never crosses a session boundary: windows start every ``stride`` turns of a session,
and a last window is added where the stride would leave the session's final turns uncovered;
a session shorter than ``w`` is one window. A window's id is the turns-table key of its
first turn, so ids are stable as sessions are added and a window index of kind ``window``
(hnswlib, BM25) uses them as labels. Windows are the ``rag`` baseline's memory and an
optional third source of the hybrid system (``retrieval.sources: [episodes, tuples, windows]``).

Turns are only ever inserted (``forget`` removes a namespace whole), so ``(count, max key)``
of a namespace's turns is an exact change marker: windows and their indexes are reloaded and
caught up only when it moves.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from hybridmem_local.config import IndexConfig
from hybridmem_local.index import VectorIndex
from hybridmem_local.lexical import LexicalIndex
from hybridmem_local.schema import EvidenceWindow, Turn
from hybridmem_local.store import MemoryStore

WINDOW_KIND = "window"


def window_starts(n_turns: int, size: int, stride: int) -> list[int]:
    """Start positions of the windows of a session of ``n_turns`` turns."""
    if size < 1 or stride < 1:
        raise ValueError(f"window size and stride must be at least 1, got size={size}, stride={stride}")
    if stride > size:
        raise ValueError(f"window stride {stride} is larger than the window size {size}: turns would be skipped")
    if n_turns <= 0:
        return []
    last = max(n_turns - size, 0)
    starts = list(range(0, last + 1, stride))
    if starts[-1] != last:
        starts.append(last)
    return starts


def window_recipe(size: int, stride: int) -> str:
    """Names a window shape in index manifests: another shape means other documents."""
    return f"window-v1 size={size} stride={stride}"


def load_windows(store: MemoryStore, namespace: str, size: int, stride: int) -> dict[int, EvidenceWindow]:
    """Every window of a namespace by id, sessions in chronological order."""
    # Windows are derived data: the turns stay the truth.
    rows = store.turn_rows(namespace)
    windows: dict[int, EvidenceWindow] = {}
    session_rows: list = []
    for row in rows + [None]:
        if session_rows and (row is None or row["session_id"] != session_rows[0]["session_id"]):
            windows.update(_session_windows(namespace, session_rows, size, stride))
            session_rows = []
        if row is not None:
            session_rows.append(row)
    return windows


def _session_windows(namespace: str, rows: list, size: int, stride: int) -> dict[int, EvidenceWindow]:
    turns = [
        Turn(turn_id=r["turn_id"], speaker=r["speaker"], text=r["text"], image_caption=r["image_caption"]) for r in rows
    ]
    date = datetime.fromisoformat(rows[0]["started_at"])
    out = {}
    for start in window_starts(len(rows), size, stride):
        first = rows[start]
        out[first["id"]] = EvidenceWindow(
            id=first["id"],
            namespace=namespace,
            session_id=first["session_id"],
            session_date=date,
            start=first["position"],
            turns=turns[start : start + size],
        )
    return out


class WindowSource:
    """The windows of one namespace with their BM25 and (built on first dense use) hnswlib indexes."""

    def __init__(
        self,
        store: MemoryStore,
        directory: Path,
        namespace: str,
        size: int,
        stride: int,
        index_config: IndexConfig,
        embedder_id: Callable[[], tuple[str, int]],
        embed: Callable[[Sequence[str]], np.ndarray],
    ):
        self.store = store
        self.directory = directory
        self.namespace = namespace
        self.size, self.stride = size, stride
        self.index_config = index_config
        self._embedder_id = embedder_id
        self._embed = embed
        self.recipe = window_recipe(size, stride)
        self.windows: dict[int, EvidenceWindow] = {}
        self._marker: tuple[int, int] | None = None
        self._lexical = LexicalIndex(directory, WINDOW_KIND, self.recipe)
        self._lexical_synced = False
        self._dense: VectorIndex | None = None
        self._dense_synced = False

    def _refresh(self) -> None:
        marker = self.store.turns_marker(self.namespace)
        if marker != self._marker:
            self.windows = load_windows(self.store, self.namespace, self.size, self.stride)
            self._marker = marker
            self._lexical_synced = self._dense_synced = False

    def _ids(self) -> np.ndarray:
        return np.array(sorted(self.windows), dtype=np.int64)

    def _texts(self, ids: np.ndarray) -> list[str]:
        return [self.windows[int(i)].index_text() for i in ids]

    def lexical(self) -> LexicalIndex:
        self._refresh()
        if not self._lexical_synced:
            if self._lexical.sync(self._ids(), self._texts).rebuilt:
                self._lexical.save()
            self._lexical_synced = True
        return self._lexical

    def dense(self) -> VectorIndex:
        self._refresh()
        if self._dense is None:
            model_id, dim = self._embedder_id()
            # The manifest's model id also names the window shape: vectors of other windows are rebuilt.
            self._dense = VectorIndex(self.directory, WINDOW_KIND, f"{model_id}|{self.recipe}", dim, self.index_config)
        if not self._dense_synced:
            report = self._dense.sync(self._ids(), lambda ids: self._embed(self._texts(ids)))
            if report.rebuilt or report.added or report.removed:
                self._dense.save()
            self._dense_synced = True
        return self._dense

    def get(self, ids: Sequence[int]) -> dict[int, EvidenceWindow]:
        return {int(i): self.windows[int(i)] for i in ids if int(i) in self.windows}


class WindowSources:
    """One :class:`WindowSource` per namespace; ``shape()`` gives the current (size, stride)."""

    def __init__(
        self,
        store: MemoryStore,
        index_dir: Callable[[str], Path],
        index_config: IndexConfig,
        shape: Callable[[], tuple[int, int]],
        embedder_id: Callable[[], tuple[str, int]],
        embed: Callable[[str, Sequence[str]], np.ndarray],
    ):
        self.store = store
        self.index_dir = index_dir
        self.index_config = index_config
        self._shape = shape
        self._embedder_id = embedder_id
        self._embed = embed
        self._sources: dict[str, WindowSource] = {}

    def get(self, namespace: str) -> WindowSource:
        size, stride = self._shape()
        source = self._sources.get(namespace)
        if source is None or (source.size, source.stride) != (size, stride):
            source = self._sources[namespace] = WindowSource(
                self.store, self.index_dir(namespace), namespace, size, stride, self.index_config,
                self._embedder_id, lambda texts: self._embed(namespace, texts),
            )
        return source

    def drop(self, namespace: str) -> None:
        """Forget the namespace's windows and delete their index files (both kinds)."""
        self._sources.pop(namespace, None)
        directory = self.index_dir(namespace)
        LexicalIndex(directory, WINDOW_KIND).delete_files()
        for path in VectorIndex(directory, WINDOW_KIND, "", 0, self.index_config).files():
            path.unlink(missing_ok=True)
