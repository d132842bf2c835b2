"""Fault injection and bad input: crashes, concurrent writers, full or read-only disks, broken
LLM replies and malformed files, each against the real store, indexes, MiniLM and LLM backends."""
