"""BM25 indexes (bm25s tokenizer + PyStemmer, Lucene BM25 scoring): the lexical half of hybrid retrieval.

One index per (namespace, source) — episodes, tuples, evidence windows — beside the hnswlib
index of the same source, and like it a rebuildable cache of SQLite caught up by
``store_indexes.StoreIndexes``: documents are added and removed one by one (only new documents are
tokenized), so a write costs the next search milliseconds, not a rebuild of the whole index
(bm25s itself cannot add or remove documents; it is used for tokenizing only). Scores are
computed at query time from term frequencies, document lengths and document frequencies,
with bm25s's default Lucene variant (k1 = 1.5, b = 0.75), so they always reflect the
current corpus (what a query derives from the postings is kept only until the next change).

On disk, in ``<store>.indexes/<namespace>/``:

* ``<kind>.bm25.json`` — the manifest: format, text recipe, tokenizer, document count and
  the build it describes;
* ``<kind>.bm25.<build>.*`` — that build's files: ``labels.npy`` (each document's id),
  ``indptr.npy``/``indices.npy``/``data.npy`` (each document's term ids and counts, CSR) and
  ``vocab.json`` (the terms).

Saving follows ``files.paths.GenerationFiles`` (a crash leaves the old index or the new one, never
a mix); a missing, unreadable or foreign index is rebuilt, never an error. Files are 0600 and
folders 0700: they hold words of private conversations; when the store is encrypted every
build file (``vocab.json`` holds the conversations' words) is sealed with its key, and one that
fails to unseal is rebuilt like any damaged file.
"""

from __future__ import annotations

import functools
import io
import json
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict

from hybridmem_local.errors import InvalidInputError
from hybridmem_local.files.paths import GenerationFiles
from hybridmem_local.indexes.vectors import SyncReport
from hybridmem_local.schema import Episode, RelationalTuple
from hybridmem_local.text.stems import TOKENIZER, tokenize

log = logging.getLogger(__name__)


#: Bumped when the on-disk layout changes; older indexes are then rebuilt.
FORMAT = 2
#: BM25 parameters (bm25s's defaults, Lucene variant).
K1 = 1.5
B = 0.75

#: Returns the text of each id, in order.
TextSource = Callable[[np.ndarray], Sequence[str]]


@functools.lru_cache(maxsize=64)
def _query_terms(query: str) -> tuple[str, ...]:
    """``tokenize`` of one query, kept: a search scores the same query against each store's index."""
    return tuple(tokenize([query])[0])


def bm25_document(memory: Episode | RelationalTuple) -> str:
    """What BM25 indexes of a memory: an episode's title, summary and details, a tuple's NL string.

    Dense search reads an episode's ``details`` only (paper §3.3); lexical search also gets
    the title and summary, whose names and key words are what an exact-match query hits. A
    field that repeats another verbatim is indexed once, so it does not double its terms' weight.
    """
    if isinstance(memory, Episode):
        return "\n".join(dict.fromkeys((memory.title, memory.summary, memory.details)))
    return memory.render()


class _Scoring(NamedTuple):
    """A LexicalIndex's per-query inputs derived from its postings (dropped on any change)."""

    labels: np.ndarray  # slot → document id, -1 for an empty slot
    norm: np.ndarray  # slot → BM25 length normalisation
    #: term id → the term's BM25 weight in each document of its postings, for the terms queried
    #: so far (at most one float per posting)
    weights: dict[int, np.ndarray]


class LexicalManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int = FORMAT
    #: What the documents are (e.g. which fields, which window shape); a change means rebuild.
    recipe: str
    tokenizer: str = TOKENIZER
    count: int
    #: Names this build's files (``<kind>.bm25.<build>.*``).
    build: str


class LexicalIndex:
    """A BM25 index whose documents are labelled with integer ids (memory or window ids).

    Documents sit in slots (positions of the per-slot arrays); a removed document leaves an
    empty slot until the slots are compacted. Each term keeps its postings as two arrays
    (slots, counts), so a query touches only the postings of its own terms.
    """

    def __init__(self, directory: Path, kind: str, recipe: str = "default", key: bytes | None = None):
        """``key``: the store's file-sealing key when it is encrypted (the files are sealed)."""
        self.directory = directory
        self.kind = kind
        self.recipe = recipe
        self._files = GenerationFiles(
            directory, f"{kind}.bm25.json", f"{kind}.bm25.{{}}.", f"{kind}.bm25.json.{{}}.tmp", "build", key
        )
        self._loaded = False
        self._clear()

    def _clear(self) -> None:
        self._labels: list[int] = []  # slot → document id, -1 for an empty slot
        self._lengths: list[int] = []  # slot → number of tokens
        self._slot_of: dict[int, int] = {}
        self._vocab: dict[str, int] = {}
        self._postings: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # term id → (slots, counts)
        self._doc_terms: dict[int, tuple[list[int], list[int]]] = {}  # slot → (term ids, counts): to save and remove it
        self._total_length = 0
        self._dirty = False
        self._scoring: _Scoring | None = None  # see _scoring_state

    # ------------------------------------------------------------------ files

    def files(self) -> list[Path]:
        """Every file of this index on disk (including leftovers of a crashed save)."""
        return self._files.files()

    def delete_files(self) -> None:
        self._files.delete()
        self._clear()
        self._loaded = False

    # ------------------------------------------------------------------ lifecycle

    def _load(self) -> str | None:
        """Load the persisted index; returns why it cannot be used, or None on success."""
        if not self._files.manifest_path.exists():
            return "index files missing"
        try:
            manifest = LexicalManifest.model_validate_json(self._files.manifest_path.read_text())
            if (manifest.format, manifest.recipe, manifest.tokenizer) != (FORMAT, self.recipe, TOKENIZER):
                return (
                    f"index built as {manifest.recipe!r} with {manifest.tokenizer}, wanted {self.recipe!r} with "
                    f"{TOKENIZER}"
                )
            read = functools.partial(self._files.read_bytes, manifest.build)
            labels = np.load(io.BytesIO(read("labels.npy")))
            indptr, indices, data = (np.load(io.BytesIO(read(f"{name}.npy"))) for name in ("indptr", "indices", "data"))
            terms = json.loads(read("vocab.json"))
            if labels.ndim != 1 or len(labels) != manifest.count or len(indptr) != len(labels) + 1:
                return "label file does not match manifest"
            if (
                len(indices) != len(data)
                or indptr[-1] != len(indices)
                or (len(indices) and indices.max() >= len(terms))
            ):
                return "term arrays do not match"
        except Exception as exc:  # any unreadable file means: rebuild from SQLite
            return f"index unreadable ({type(exc).__name__}: {exc})"
        self._clear()
        slots = np.repeat(np.arange(len(labels), dtype=np.int64), np.diff(indptr))
        self._labels = [int(x) for x in labels]
        self._slot_of = {label: slot for slot, label in enumerate(self._labels)}
        self._lengths = [int(x) for x in np.bincount(slots, weights=data, minlength=len(labels))]
        self._total_length = sum(self._lengths)
        self._vocab = {term: i for i, term in enumerate(terms)}
        self._doc_terms = {
            slot: (
                indices[indptr[slot] : indptr[slot + 1]].tolist(),
                data[indptr[slot] : indptr[slot + 1]].astype(int).tolist(),
            )
            for slot in range(len(labels))
        }
        order = np.argsort(indices, kind="stable")
        bounds = np.flatnonzero(np.diff(indices[order])) + 1
        for group in np.split(order, bounds) if len(order) else []:
            self._postings[int(indices[group[0]])] = (slots[group], data[group].astype(np.float32))
        return None

    def sync(self, active_ids: np.ndarray, texts_for: TextSource) -> SyncReport:
        """Make the index hold exactly ``active_ids``: load, then add and remove the difference
        (or build from scratch when the saved index cannot be used)."""
        wanted = set(np.asarray(active_ids, dtype=np.int64).tolist())
        if not self._loaded:
            self._loaded = True
            problem = self._load()
            if problem is not None:
                log.info("rebuilding %s lexical index in %s: %s", self.kind, self.directory, problem)
                ids = np.array(sorted(wanted), dtype=np.int64)
                self.build(ids, texts_for(ids))
                return SyncReport(rebuilt=True, reason=problem, added=len(ids))
        to_remove = sorted(set(self._slot_of) - wanted)
        to_add = np.array(sorted(wanted - set(self._slot_of)), dtype=np.int64)
        self.remove(to_remove)
        if len(to_add):
            self.add(to_add, texts_for(to_add))
        return SyncReport(added=len(to_add), removed=len(to_remove))

    def build(self, ids: np.ndarray, texts: Sequence[str]) -> None:
        """Index ``texts`` under ``ids`` from scratch (in memory; ``save`` persists it)."""
        self._clear()
        self._loaded = True
        self.add(ids, texts)
        self._dirty = True

    def add(self, ids: np.ndarray, texts: Sequence[str]) -> None:
        """Add documents (a document already present is replaced)."""
        doc_ids = [int(i) for i in np.asarray(ids, dtype=np.int64)]
        if len(doc_ids) != len(texts):
            raise InvalidInputError(f"{self.kind} lexical index: {len(doc_ids)} ids for {len(texts)} texts")
        self.remove([i for i in doc_ids if i in self._slot_of])
        new_postings: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for doc_id, tokens in zip(doc_ids, tokenize(texts) if doc_ids else [], strict=True):
            slot = len(self._labels)
            self._labels.append(doc_id)
            self._lengths.append(len(tokens))
            self._total_length += len(tokens)
            self._slot_of[doc_id] = slot
            term_counts = Counter(tokens)
            term_ids = [self._vocab.setdefault(term, len(self._vocab)) for term in term_counts]
            self._doc_terms[slot] = (term_ids, list(term_counts.values()))
            for term_id, count in zip(term_ids, term_counts.values(), strict=True):
                new_postings[term_id].append((slot, count))
        for term_id, pairs in new_postings.items():
            slots = np.array([p[0] for p in pairs], dtype=np.int64)
            counts = np.array([p[1] for p in pairs], dtype=np.float32)
            if term_id in self._postings:
                old_slots, old_counts = self._postings[term_id]
                slots, counts = np.concatenate([old_slots, slots]), np.concatenate([old_counts, counts])
            self._postings[term_id] = (slots, counts)
        self._dirty = self._dirty or bool(doc_ids)
        self._scoring = None

    def remove(self, ids: Sequence[int]) -> None:
        """Remove documents by id (ids not in the index are ignored)."""
        slots = [self._slot_of.pop(int(i)) for i in ids if int(i) in self._slot_of]
        if not slots:
            return
        touched: set[int] = set()
        for slot in slots:
            touched.update(self._doc_terms.pop(slot)[0])
            self._total_length -= self._lengths[slot]
            self._labels[slot], self._lengths[slot] = -1, 0
        gone = np.array(slots, dtype=np.int64)
        for term_id in touched:
            term_slots, counts = self._postings[term_id]
            keep = ~np.isin(term_slots, gone)
            if keep.any():
                self._postings[term_id] = (term_slots[keep], counts[keep])
            else:
                del self._postings[term_id]
        self._dirty = True
        self._scoring = None
        if len(self._labels) > 2 * len(self._slot_of) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop empty slots (and unused terms) by renumbering the live documents."""
        live = sorted(self._slot_of.items())  # (doc id, old slot)
        renumber = np.full(len(self._labels), -1, dtype=np.int64)
        for new, (_, old) in enumerate(live):
            renumber[old] = new
        self._labels = [doc_id for doc_id, _ in live]
        self._lengths = [self._lengths[old] for _, old in live]
        self._doc_terms = {new: self._doc_terms[old] for new, (_, old) in enumerate(live)}
        self._slot_of = {doc_id: new for new, (doc_id, _) in enumerate(live)}
        self._postings = {t: (renumber[slots], counts) for t, (slots, counts) in self._postings.items()}
        self._scoring = None

    def save(self) -> None:
        """Persist a changed index as a new build (``files.paths.GenerationFiles``)."""
        if not self._dirty or not self._loaded:
            return
        live = sorted(self._slot_of.items())
        labels = np.array([doc_id for doc_id, _ in live], dtype=np.int64)
        rows = [self._doc_terms[slot] for _, slot in live]
        indptr = np.cumsum([0] + [len(term_ids) for term_ids, _ in rows]).astype(np.int64)
        indices = np.array([t for term_ids, _ in rows for t in term_ids], dtype=np.int64)
        data = np.array([c for _, counts in rows for c in counts], dtype=np.float32)
        terms = sorted(self._vocab, key=self._vocab.__getitem__)

        def write(build: str) -> None:
            for name, array in (("labels", labels), ("indptr", indptr), ("indices", indices), ("data", data)):
                buffer = io.BytesIO()
                np.save(buffer, array)
                self._files.write_bytes(build, f"{name}.npy", buffer.getvalue())
            self._files.write_bytes(build, "vocab.json", json.dumps(terms).encode())

        self._files.save(write, lambda build: LexicalManifest(recipe=self.recipe, count=len(labels), build=build))
        self._dirty = False

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._slot_of)

    def _scoring_state(self) -> _Scoring:
        """What queries derive from the postings, kept until the index changes: converting the
        per-slot lists on every query cost ~3 ms a search at 100k documents."""
        if self._scoring is None:
            lengths = np.asarray(self._lengths, dtype=np.float64)
            norm = K1 * ((1 - B) + B * lengths / (self._total_length / len(self._slot_of)))
            self._scoring = _Scoring(np.asarray(self._labels, dtype=np.int64), norm, {})
        return self._scoring

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Top-k (id, BM25 score) of the documents sharing at least one term with ``query``."""
        if not self._slot_of or k <= 0:
            return []
        # A repeated query word counts once per occurrence, as in bm25s.
        term_ids = [
            self._vocab[t] for t in _query_terms(query) if t in self._vocab and self._vocab[t] in self._postings
        ]
        if not term_ids:
            return []
        n_docs = len(self._slot_of)
        state = self._scoring_state()
        scores = np.zeros(len(state.labels), dtype=np.float64)
        for term_id in term_ids:
            slots, counts = self._postings[term_id]
            weights = state.weights.get(term_id)
            if weights is None:
                idf = np.log(1 + (n_docs - len(slots) + 0.5) / (len(slots) + 0.5))
                weights = state.weights[term_id] = idf * counts / (state.norm[slots] + counts)
            scores[slots] += weights
        matching = np.flatnonzero(scores > 0)
        if len(matching) > k:
            # Common words match most of a large store: select the top k before sorting them.
            kth = np.partition(scores[matching], len(matching) - k)[len(matching) - k]
            matching = matching[scores[matching] >= kth]
        labels, found = state.labels[matching], scores[matching]
        # Equal scores in id order, so results are reproducible however the slots were filled.
        order = np.lexsort((labels, -found))[:k]
        return [(int(label), float(score)) for label, score in zip(labels[order], found[order], strict=True)]
