"""The SQLite store: the single source of truth (sessions, memories, history, consolidation
runs, API keys, embedding cache). Everything else can be rebuilt from it."""
