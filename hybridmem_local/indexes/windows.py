"""Evidence windows: the raw turns the store keeps, searched as ``w`` consecutive turns.

A window never crosses a session boundary: windows start every ``stride`` turns of a session,
and a last window is added where the stride would leave the session's final turns uncovered;
a session shorter than ``w`` is one window. A window's id is the turns-table key of its
first turn, so ids are stable as sessions are added and a window index of kind ``window``
(hnswlib, BM25) uses them as labels. Windows are the ``rag`` baseline's memory and an
optional third source of the hybrid system (``retrieval.sources: [episodes, tuples, windows]``).

Turns are only ever inserted (``forget`` removes a namespace whole), so ``(count, max key)``
of a namespace's turns is an exact change marker: windows are reloaded only when it moves
(their indexes live in ``store_indexes.py`` with the memories').
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final

import numpy as np

from hybridmem_local.errors import InvalidInputError
from hybridmem_local.schema import EvidenceWindow, SearchResult, Turn
from hybridmem_local.storage.store import MemoryStore

WINDOW_KIND: Final = "window"


def window_starts(n_turns: int, size: int, stride: int) -> list[int]:
    """Start positions of the windows of a session of ``n_turns`` turns."""
    if size < 1 or stride < 1:
        raise InvalidInputError(f"window size and stride must be at least 1, got size={size}, stride={stride}")
    if stride > size:
        raise InvalidInputError(f"window stride {stride} is larger than the window size {size}: turns would be skipped")
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
    rows = store.sessions.turn_rows(namespace)
    windows: dict[int, EvidenceWindow] = {}
    session_rows: list = []
    for row in rows + [None]:
        if session_rows and (row is None or row.session_id != session_rows[0].session_id):
            windows.update(_session_windows(namespace, session_rows, size, stride))
            session_rows = []
        if row is not None:
            session_rows.append(row)
    return windows


def with_source_turns(store: MemoryStore, result: SearchResult) -> SearchResult:
    """``result`` with its memories' source turns attached (``SearchResult.source_turns``), each
    a one-turn window, so an answer context can show them beside (and merged with) the windows.
    Turn ids the namespace does not hold are left out; the memory still names them."""
    turn_ids = [t for memory in result.memories() for t in memory.source_turn_ids]
    rows = store.sessions.turn_rows_by_id(result.namespace, turn_ids) if turn_ids else []
    return result.model_copy(
        update={
            "source_turns": [
                EvidenceWindow(
                    id=row.id,
                    namespace=result.namespace,
                    session_id=row.session_id,
                    session_date=datetime.fromisoformat(row.started_at),
                    start=row.position,
                    turns=[_turn(row)],
                )
                for row in rows
            ]
        }
    )


def _turn(row) -> Turn:
    return Turn(turn_id=row.turn_id, speaker=row.speaker, text=row.text, image_caption=row.image_caption)


def _session_windows(namespace: str, rows: list, size: int, stride: int) -> dict[int, EvidenceWindow]:
    turns = [_turn(r) for r in rows]
    date = datetime.fromisoformat(rows[0].started_at)
    out = {}
    for start in window_starts(len(rows), size, stride):
        first = rows[start]
        out[first.id] = EvidenceWindow(
            id=first.id,
            namespace=namespace,
            session_id=first.session_id,
            session_date=date,
            start=first.position,
            turns=turns[start : start + size],
        )
    return out


class WindowSet:
    """The windows of one namespace in one shape, reloaded only when the namespace's turns change."""

    def __init__(self, store: MemoryStore, namespace: str, size: int, stride: int):
        self.store = store
        self.namespace = namespace
        self.size, self.stride = size, stride
        self.recipe = window_recipe(size, stride)
        self.windows: dict[int, EvidenceWindow] = {}
        self._marker: tuple[int, int] | None = None

    def refresh(self) -> None:
        marker = self.store.sessions.turns_marker(self.namespace)
        if marker != self._marker:
            self.windows = load_windows(self.store, self.namespace, self.size, self.stride)
            self._marker = marker

    def ids(self) -> np.ndarray:
        return np.array(sorted(self.windows), dtype=np.int64)

    def texts(self, ids: np.ndarray) -> list[str]:
        return [self.windows[int(i)].index_text() for i in ids]

    def get(self, ids: Sequence[int]) -> dict[int, EvidenceWindow]:
        return {int(i): self.windows[int(i)] for i in ids if int(i) in self.windows}
