"""Curation (paper §3.1): a session's turns in, episodes and relational tuples out; relative
dates made absolute first, repeats of stored memories folded at write time."""
