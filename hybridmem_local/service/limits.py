"""Request limits: a per-key token bucket, the bounded body read, and which hosts count as loopback."""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections.abc import Awaitable, Callable

from hybridmem_local.errors import PayloadTooLargeError

Receive = Callable[[], Awaitable[dict]]


class RateLimiter:
    """One token bucket per API key: ``rate`` tokens a second, at most ``burst`` saved up.

    A request takes one token; with none left it is refused and told when the next one comes.
    Buckets live in memory only: a restart forgives everyone, which is fine for abuse control.
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key id → (tokens, time of last refill)
        self._lock = threading.Lock()

    def take(self, key_id: str) -> float | None:
        """None if the request may go ahead, else the seconds to wait before retrying."""
        with self._lock:
            now = self._clock()
            tokens, last = self._buckets.get(key_id, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[key_id] = (tokens - 1.0, now)
                return None
            self._buckets[key_id] = (tokens, now)
            return (1.0 - tokens) / self.rate


def retry_after_header(seconds: float) -> str:
    """Retry-After takes whole seconds; round up so a client that obeys it is never refused again."""
    return str(max(1, math.ceil(seconds)))


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body, raising PayloadTooLargeError as soon as it passes ``limit`` bytes
    (a client may lie in Content-Length or send chunks without one)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body is over the limit of {limit} bytes (service.max_body_bytes)")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, ``localhost``)."""
    if host.lower() in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
