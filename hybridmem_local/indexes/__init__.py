"""Rebuildable search caches of the store: hnswlib vectors, BM25, evidence windows, and
``StoreIndexes``, which keeps them all in step with SQLite."""
