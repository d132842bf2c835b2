"""Word stems: how BM25 search, turn alignment and curation's grounding check see a text.

One analyzer for all three, so "the words a memory shares with a turn" means the same thing
everywhere: bm25s' tokenizer with English stopwords removed and PyStemmer's Snowball stemmer.
bm25s (which pulls in numba and scipy, 1-3 s) and PyStemmer are imported on first use, not
with the package.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence

STEMMER_LANGUAGE = "english"
STOPWORDS = "en"
#: Names the tokenizer in manifests, so an index built another way is rebuilt, not misread.
TOKENIZER = f"bm25s-{STOPWORDS}-stopwords+pystemmer-{STEMMER_LANGUAGE}"


@functools.cache
def _bm25s():
    """Import bm25s on first use; it sets its own logger to DEBUG, which would print on every build.
    Once: ``setLevel`` clears every logger's cache, ~0.6 ms a call with transformers loaded."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


_per_thread = threading.local()


def _stemmer():
    """This thread's stemmer: a Snowball stemmer keeps state between calls, and queries are
    tokenized on retrieval's ranking threads."""
    stemmer = getattr(_per_thread, "stemmer", None)
    if stemmer is None:
        import Stemmer

        stemmer = _per_thread.stemmer = Stemmer.Stemmer(STEMMER_LANGUAGE)
    return stemmer


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    """Lower-cased word tokens, English stopwords removed, Snowball-stemmed."""
    bm25s = _bm25s()

    return bm25s.tokenize(list(texts), stopwords=STOPWORDS, stemmer=_stemmer(), return_ids=False, show_progress=False)
