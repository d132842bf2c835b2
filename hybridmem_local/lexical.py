"""BM25 indexes (bm25s + PyStemmer): the lexical half of hybrid retrieval.

One index per (namespace, source) — episodes, tuples, evidence windows — beside the hnswlib
index of the same source, and like it a rebuildable cache of SQLite: on use it is checked
against the ids SQLite holds as active and rebuilt when they differ. bm25s cannot add or
remove documents, so every change is a rebuild, done lazily at the next search (a few
milliseconds per thousand short documents; see scripts/bench_retrieval_budget.py).

On disk, in ``<store>.indexes/<namespace>/``:

* ``<kind>.bm25.json`` — the manifest: format, text recipe, tokenizer, document count and
  the build it describes;
* ``<kind>.bm25.<build>.*`` — that build's files: bm25s's own (the score matrix, vocabulary,
  parameters) and ``labels.npy`` (the id of each document).

A save writes a new build's files and then replaces the manifest, so a crash leaves the old
index or the new one, never a mix, and the next save removes any other build's files; a
missing, unreadable or foreign index is rebuilt, never an error. Files are 0600 and folders
0700: they hold words of private conversations.
"""

from __future__ import annotations

import functools
import logging
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from hybridmem_local.files import ensure_private_dir, remove_orphans
from hybridmem_local.index import SyncReport
from hybridmem_local.schema import Episode, RelationalTuple
from hybridmem_local.store import MemoryStore

# bm25s (which pulls in numba and scipy, 1-3 s) and PyStemmer are imported on first lexical
# use, not with the package.
if TYPE_CHECKING:
    import bm25s

log = logging.getLogger(__name__)


def _bm25s():
    """Import bm25s on first use; it sets its own logger to DEBUG, which would print on every build."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s

#: Bumped when the on-disk layout changes; older indexes are then rebuilt.
FORMAT = 1
STEMMER_LANGUAGE = "english"
STOPWORDS = "en"
#: Names the tokenizer in manifests, so an index built another way is rebuilt, not misread.
TOKENIZER = f"bm25s-{STOPWORDS}-stopwords+pystemmer-{STEMMER_LANGUAGE}"

#: Returns the text of each id, in order.
TextSource = Callable[[np.ndarray], Sequence[str]]


@functools.cache
def _stemmer():
    import Stemmer

    return Stemmer.Stemmer(STEMMER_LANGUAGE)


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    """Lower-cased word tokens, English stopwords removed, Snowball-stemmed."""
    bm25s = _bm25s()

    return bm25s.tokenize(list(texts), stopwords=STOPWORDS, stemmer=_stemmer(), return_ids=False, show_progress=False)


def memory_text(memory: Episode | RelationalTuple) -> str:
    """What BM25 sees of a memory: an episode's title, summary and details, a tuple's NL string.

    Dense search reads an episode's ``details`` only (paper §3.3); lexical search also gets
    the title and summary, whose names and key words are what an exact-match query hits. A
    field that repeats another verbatim is indexed once, so it does not double its terms' weight.
    """
    if isinstance(memory, Episode):
        return "\n".join(dict.fromkeys((memory.title, memory.summary, memory.details)))
    return memory.render()


class LexicalManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int = FORMAT
    #: What the documents are (e.g. which fields, which window shape); a change means rebuild.
    recipe: str
    tokenizer: str = TOKENIZER
    count: int
    #: False when no document has a single term (bm25s writes no files for such a corpus).
    has_terms: bool
    #: Names this build's files (``<kind>.bm25.<build>.*``).
    build: str


class LexicalIndex:
    """A BM25 index whose documents are labelled with integer ids (memory or window ids)."""

    def __init__(self, directory: Path, kind: str, recipe: str = "default"):
        self.directory = directory
        self.kind = kind
        self.recipe = recipe
        self._bm25: bm25s.BM25 | None = None
        self._labels: np.ndarray | None = None  # None: not loaded or built yet
        self._dirty = False

    # ------------------------------------------------------------------ files

    @property
    def _manifest_path(self) -> Path:
        return self.directory / f"{self.kind}.bm25.json"

    def _build_files(self, build: str) -> dict[str, str]:
        """File names of one build, keyed by the bm25s ``save``/``load`` argument they fill."""
        stem = f"{self.kind}.bm25.{build}"
        return {
            "data_name": f"{stem}.data.npy",
            "indices_name": f"{stem}.indices.npy",
            "indptr_name": f"{stem}.indptr.npy",
            "vocab_name": f"{stem}.vocab.json",
            "params_name": f"{stem}.params.json",
            "nnoc_name": f"{stem}.nonoccurrence.npy",
        }

    def _labels_path(self, build: str) -> Path:
        return self.directory / f"{self.kind}.bm25.{build}.labels.npy"

    def files(self) -> list[Path]:
        """Every file of this index on disk (including leftovers of a crashed save)."""
        if not self.directory.exists():
            return []
        return sorted(self.directory.glob(f"{self.kind}.bm25.*"))

    def delete_files(self) -> None:
        for path in self.files():
            path.unlink(missing_ok=True)
        self._bm25, self._labels, self._dirty = None, None, False

    # ------------------------------------------------------------------ lifecycle

    def _load(self) -> str | None:
        """Load the persisted index; returns why it cannot be used, or None on success."""
        if not self._manifest_path.exists():
            return "index files missing"
        try:
            manifest = LexicalManifest.model_validate_json(self._manifest_path.read_text())
            if (manifest.format, manifest.recipe, manifest.tokenizer) != (FORMAT, self.recipe, TOKENIZER):
                return f"index built as {manifest.recipe!r} with {manifest.tokenizer}, wanted {self.recipe!r} with {TOKENIZER}"
            labels = np.load(self._labels_path(manifest.build))
            if labels.ndim != 1 or len(labels) != manifest.count:
                return "label file does not match manifest"
            bm25 = None
            if manifest.has_terms:
                bm25s = _bm25s()

                bm25 = bm25s.BM25.load(
                    str(self.directory), **self._build_files(manifest.build), show_progress=False
                )
                if int(bm25.scores["num_docs"]) != manifest.count:
                    return "bm25 matrix does not match manifest"
        except Exception as exc:  # any unreadable file means: rebuild from SQLite
            return f"index unreadable ({type(exc).__name__}: {exc})"
        self._bm25, self._labels = bm25, labels.astype(np.int64)
        return None

    def sync(self, active_ids: np.ndarray, texts_for: TextSource) -> SyncReport:
        """Make the index hold exactly ``active_ids`` (rebuilding it if they differ)."""
        wanted = np.unique(np.asarray(active_ids, dtype=np.int64))
        problem = None
        if self._labels is None:
            problem = self._load()
        if problem is None and self._labels is not None and np.array_equal(self._labels, wanted):
            return SyncReport()
        old = set() if self._labels is None else set(self._labels.tolist())
        new = set(wanted.tolist())
        reason = problem or "ids differ from SQLite"
        log.info("rebuilding %s lexical index in %s: %s", self.kind, self.directory, reason)
        self.build(wanted, texts_for(wanted))
        return SyncReport(rebuilt=True, reason=reason, added=len(new - old), removed=len(old - new))

    def build(self, ids: np.ndarray, texts: Sequence[str]) -> None:
        """Index ``texts`` under ``ids`` from scratch (in memory; ``save`` persists it)."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) != len(texts):
            raise ValueError(f"{self.kind} lexical index: {len(ids)} ids for {len(texts)} texts")
        order = np.argsort(ids, kind="stable")
        ids, texts = ids[order], [texts[i] for i in order]
        corpus = tokenize(texts)
        bm25 = None
        # bm25s cannot index a corpus without a single token; such an index simply finds nothing.
        if any(corpus):
            bm25s = _bm25s()

            bm25 = bm25s.BM25()
            bm25.index(corpus, show_progress=False)
        self._bm25, self._labels, self._dirty = bm25, ids, True

    def save(self) -> None:
        """Persist a changed index: the new build's files, then the manifest, then cleanup."""
        if not self._dirty or self._labels is None:
            return
        ensure_private_dir(self.directory)
        build = uuid.uuid4().hex[:12]
        if self._bm25 is not None:
            self._bm25.save(str(self.directory), **self._build_files(build), show_progress=False)
        np.save(self._labels_path(build), self._labels)
        current = f"{self.kind}.bm25.{build}."
        for path in self.files():
            if path.name.startswith(current):
                os.chmod(path, 0o600)
        tmp_manifest = self.directory / f"{self.kind}.bm25.json.{build}.tmp"  # unique: processes may save at once
        tmp_manifest.write_text(
            LexicalManifest(
                recipe=self.recipe, count=len(self._labels), has_terms=self._bm25 is not None, build=build
            ).model_dump_json()
        )
        os.chmod(tmp_manifest, 0o600)
        replaced = self._committed_build()
        os.replace(tmp_manifest, self._manifest_path)
        # Remove at once only the build this save replaced: another process may be mid-save with
        # files of its own that no manifest names yet; other unnamed files go once they are old.
        if replaced is not None and replaced != build:
            for path in self.files():
                if path.name.startswith(f"{self.kind}.bm25.{replaced}."):
                    path.unlink(missing_ok=True)
        committed = self._committed_build()
        remove_orphans(
            p for p in self.files()
            if p != self._manifest_path and not (committed and p.name.startswith(f"{self.kind}.bm25.{committed}."))
        )
        self._dirty = False

    def _committed_build(self) -> str | None:
        try:
            return LexicalManifest.model_validate_json(self._manifest_path.read_text()).build
        except (OSError, ValueError):
            return None

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return 0 if self._labels is None else len(self._labels)

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Top-k (id, BM25 score) of the documents sharing at least one term with ``query``."""
        if self._bm25 is None or k <= 0:
            return []
        token_ids = self._bm25.get_tokens_ids(tokenize([query])[0])
        if not token_ids:
            return []
        scores = self._bm25.get_scores_from_ids(token_ids)
        matching = np.flatnonzero(scores > 0)
        # Stable sort: equal scores keep id order, so results are reproducible.
        if len(matching) > k:
            # Common words match most of a large store: select the top k before sorting them
            # (3 ms → 0.2 ms at 100k documents, scripts/bench_search.py).
            kth = np.partition(scores[matching], len(matching) - k)[len(matching) - k]
            matching = matching[scores[matching] >= kth]
        top = matching[np.argsort(-scores[matching], kind="stable")[:k]]
        return [(int(self._labels[i]), float(scores[i])) for i in top]


class MemoryLexicalIndexes:
    """The BM25 indexes of the memory stores, one per (namespace, kind), in step with SQLite.

    An index is checked against SQLite's active ids when first used and again whenever the
    event log has moved (every memory write, from this process or another, adds an event),
    and rebuilt and saved when the ids differ.
    """

    #: Changing what :func:`memory_text` returns must change this, so old indexes rebuild.
    RECIPE = "memory-v1: episode title+summary+details; tuple render()"

    def __init__(self, store: MemoryStore, index_dir: Callable[[str], Path]):
        self.store = store
        self.index_dir = index_dir
        self._indexes: dict[tuple[str, str], LexicalIndex] = {}
        self._checked_at: dict[tuple[str, str], int] = {}

    def get(self, namespace: str, kind: str) -> LexicalIndex:
        key = (namespace, kind)
        index = self._indexes.get(key)
        if index is None:
            index = self._indexes[key] = LexicalIndex(self.index_dir(namespace), kind, self.RECIPE)
        marker = self.store.last_event_id()
        if self._checked_at.get(key) != marker:
            report = index.sync(self.store.active_ids(namespace, kind), self._texts)
            if report.rebuilt:
                index.save()
            self._checked_at[key] = marker
        return index

    def _texts(self, ids: np.ndarray) -> list[str]:
        rows = self.store.get_memories([int(i) for i in ids])
        return [memory_text(rows[int(i)]) for i in ids]

    def drop(self, namespace: str) -> None:
        """Forget the namespace's loaded indexes and delete their files."""
        for kind in {k for ns, k in self._indexes if ns == namespace} | {"episode", "tuple"}:
            index = self._indexes.pop((namespace, kind), None) or LexicalIndex(self.index_dir(namespace), kind)
            self._checked_at.pop((namespace, kind), None)
            index.delete_files()
