"""Text analysis that several stages share: word stems (what BM25 indexes) and the alignment of
a memory's text to the turns it came from."""
