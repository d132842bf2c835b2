"""Offline consolidation (paper §3.2): cluster similar memories (UMAP + HDBSCAN) and let
the LLM plan merges and deletions; ``HybridMemory`` applies, undoes and purges."""
