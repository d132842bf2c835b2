"""Sealed files: AES-256-GCM over a whole file's bytes, bound to what the file is.

A sealed blob is ``MAGIC | nonce (12 bytes) | ciphertext | tag (16 bytes)``. The ``context``
(e.g. ``"index/<namespace>/episode/<generation>/hnsw"``) is authenticated but not stored, so a
file copied to another namespace, kind or generation fails to open, as does any flipped bit or
truncation: :class:`SealError`, which index loaders treat like any unreadable cache (rebuild
from the store). 16.85 MB seal in 24 ms, open in 8 ms (docs/design/encryption-at-rest.md §3c).
"""

from __future__ import annotations

import os

from hybridmem_local.errors import SealError

MAGIC = b"HMSEAL1\x00"
NONCE_BYTES = 12


def is_sealed(blob: bytes) -> bool:
    return blob.startswith(MAGIC)


def seal(key: bytes, context: str, plaintext: bytes) -> bytes:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(NONCE_BYTES)
    return MAGIC + nonce + AESGCM(key).encrypt(nonce, plaintext, context.encode())


def unseal(key: bytes, context: str, blob: bytes) -> bytes:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if not is_sealed(blob):
        raise SealError(f"{context}: not a sealed file (no {MAGIC[:6].decode()} header)")
    nonce = blob[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
    try:
        return AESGCM(key).decrypt(nonce, blob[len(MAGIC) + NONCE_BYTES :], context.encode())
    except (InvalidTag, ValueError):
        raise SealError(f"{context}: damaged, truncated, or sealed with another key") from None
