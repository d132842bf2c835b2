"""Retrieval (paper §3.3): per store, dense and/or BM25 rankings, fused by reciprocal rank
fusion. No LLM call."""
