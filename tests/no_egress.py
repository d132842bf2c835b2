"""pytest plugin: prove a test makes no network connection beyond this machine.

Register it from ``tests/conftest.py`` with ``pytest_plugins = ["tests.no_egress"]``. Then:

* the ``no_egress`` fixture blocks egress for one test (request it by name, or
  ``@pytest.mark.usefixtures("no_egress")``);
* ``pytest --no-egress`` (or ``no_egress = true`` in the pytest ini section) blocks it for
  every test.

While active, ``socket.socket.connect``/``connect_ex``/``sendto``, ``socket.create_connection``
and ``socket.getaddrinfo`` raise :class:`EgressBlocked` for anything but loopback
(127.0.0.0/8, ::1, ``localhost``) and AF_UNIX sockets. Libraries that retry or swallow
errors (huggingface_hub does both) cannot hide an attempt: every blocked attempt is recorded
and the fixture fails the test at teardown unless the test drained them with
:meth:`EgressGuard.drain`. Sockets opened by C code that bypasses Python's ``socket`` module
are not seen; for those, run the command under ``unshare -n``.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


class EgressBlocked(ConnectionError):
    """A connection or name lookup to somewhere other than this machine was attempted."""


def is_local_address(host: object) -> bool:
    """True for loopback addresses and names; hostnames other than localhost are not local."""
    if host is None:  # getaddrinfo(None, port): the local wildcard/loopback, no lookup
        return True
    if isinstance(host, bytes):
        host = host.decode("idna", errors="replace")
    if not isinstance(host, str):
        return False
    name = host.strip("[]").split("%", 1)[0].lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


@dataclass
class EgressGuard:
    """The active guard: the attempts it blocked, as ``"call -> host:port"`` strings."""

    attempts: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def block(self, call: str, host: object, port: object = None) -> None:
        where = f"{host}:{port}" if port is not None else f"{host}"
        with self._lock:
            self.attempts.append(f"{call} -> {where}")
        raise EgressBlocked(f"network egress blocked: {call} -> {where} (only loopback is allowed in this test)")

    def drain(self) -> list[str]:
        """Return and forget the blocked attempts (for tests that expect them)."""
        with self._lock:
            drained, self.attempts = self.attempts, []
        return drained


def _address_host_port(address: object) -> tuple[object, object]:
    if isinstance(address, tuple) and address:
        return address[0], address[1] if len(address) > 1 else None
    return address, None


@contextmanager
def block_egress() -> Iterator[EgressGuard]:
    """Patch the ``socket`` module so only loopback and AF_UNIX connections go through."""
    guard = EgressGuard()
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_sendto = socket.socket.sendto
    real_create_connection = socket.create_connection
    real_getaddrinfo = socket.getaddrinfo

    def check_socket(sock: socket.socket, call: str, address: object) -> None:
        if sock.family == getattr(socket, "AF_UNIX", None):
            return
        host, port = _address_host_port(address)
        if not is_local_address(host):
            guard.block(call, host, port)

    def connect(self: socket.socket, address: object) -> None:
        check_socket(self, "socket.connect", address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: object) -> int:
        check_socket(self, "socket.connect_ex", address)
        return real_connect_ex(self, address)

    def sendto(self: socket.socket, data: bytes, *args: object) -> int:
        check_socket(self, "socket.sendto", args[-1])  # sendto(data, [flags,] address)
        return real_sendto(self, data, *args)

    def create_connection(address: tuple, *args: object, **kwargs: object) -> socket.socket:
        host, port = _address_host_port(address)
        if not is_local_address(host):
            guard.block("socket.create_connection", host, port)
        return real_create_connection(address, *args, **kwargs)

    def getaddrinfo(host: object, port: object, *args: object, **kwargs: object) -> list:
        if not is_local_address(host):
            guard.block("socket.getaddrinfo", host, port)
        return real_getaddrinfo(host, port, *args, **kwargs)

    # Patching the class is the point: every socket, whoever made it, goes through the guard.
    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    socket.socket.sendto = sendto  # type: ignore[method-assign]
    socket.create_connection = create_connection
    socket.getaddrinfo = getaddrinfo
    try:
        yield guard
    finally:
        socket.socket.connect = real_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = real_connect_ex  # type: ignore[method-assign]
        socket.socket.sendto = real_sendto  # type: ignore[method-assign]
        socket.create_connection = real_create_connection
        socket.getaddrinfo = real_getaddrinfo


def _guarded_test() -> Iterator[EgressGuard]:
    with block_egress() as guard:
        yield guard
    if guard.attempts:
        pytest.fail(
            "the test attempted network egress (blocked, but it must not try):\n  " + "\n  ".join(guard.attempts),
            pytrace=False,
        )


@pytest.fixture
def no_egress() -> Iterator[EgressGuard]:
    """Block non-loopback network access for this test; fail it if any attempt was made."""
    yield from _guarded_test()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--no-egress", action="store_true", help="block non-loopback network access in every test")
    parser.addini("no_egress", type="bool", default=False, help="block non-loopback network access in every test")


def _enabled_everywhere(config: pytest.Config) -> bool:
    return bool(config.getoption("--no-egress") or config.getini("no_egress"))


@pytest.fixture(autouse=True)
def _no_egress_everywhere(request: pytest.FixtureRequest) -> Iterator[EgressGuard | None]:
    """The autouse form: active only with ``--no-egress`` / ``no_egress = true``."""
    if not _enabled_everywhere(request.config) or "no_egress" in request.fixturenames:
        yield None
        return
    yield from _guarded_test()
