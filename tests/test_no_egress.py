"""The egress guard itself: outbound attempts are caught and recorded, loopback still works."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
import urllib.request

import pytest

from tests.no_egress import EgressBlocked, block_egress, is_local_address

OUTSIDE = ("93.184.216.34", 80)  # example.com's long-standing address


def test_outbound_connect_is_blocked_and_recorded(no_egress):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        with pytest.raises(EgressBlocked, match="93.184.216.34:80"):
            sock.connect(OUTSIDE)
        with pytest.raises(EgressBlocked):
            sock.connect_ex(OUTSIDE)
    with pytest.raises(EgressBlocked):
        socket.create_connection(OUTSIDE, timeout=1)
    with pytest.raises(EgressBlocked, match="example.com"):
        socket.getaddrinfo("example.com", 443)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, pytest.raises(EgressBlocked):
        udp.sendto(b"\0", ("8.8.8.8", 53))  # a DNS query sent without connect()
    assert no_egress.drain() == [
        "socket.connect -> 93.184.216.34:80",
        "socket.connect_ex -> 93.184.216.34:80",
        "socket.create_connection -> 93.184.216.34:80",
        "socket.getaddrinfo -> example.com:443",
        "socket.sendto -> 8.8.8.8:53",
    ]


def test_http_client_is_blocked_even_by_hostname(no_egress):
    with pytest.raises(OSError):  # urllib wraps the EgressBlocked from getaddrinfo in URLError
        urllib.request.urlopen("http://example.com/", timeout=1)
    assert no_egress.drain() == ["socket.create_connection -> example.com:80"]


def test_an_attempt_swallowed_by_the_code_still_fails_the_test():
    """A library that catches the error cannot hide the attempt: teardown reports it."""
    from tests.no_egress import _guarded_test

    guarded = _guarded_test()
    next(guarded)
    with contextlib.suppress(OSError):  # what a retrying client does
        socket.create_connection(OUTSIDE, timeout=1)
    with pytest.raises(pytest.fail.Exception, match="create_connection -> 93.184.216.34:80"):
        next(guarded)


@pytest.fixture
def loopback_http_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), _HelloHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address
    server.shutdown()
    server.server_close()


class _HelloHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the stdlib's name)
        body = b"hello from loopback"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_loopback_still_works(no_egress, loopback_http_server):
    host, port = loopback_http_server
    for url in (f"http://127.0.0.1:{port}/", f"http://localhost:{port}/"):
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.read() == b"hello from loopback"
    assert no_egress.attempts == []


def test_unix_sockets_are_allowed(no_egress, tmp_path):
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            conn, _ = server.accept()
            with conn:
                client.sendall(b"ping")
                assert conn.recv(4) == b"ping"


def test_guard_restores_the_socket_module():
    originals = (socket.socket.connect, socket.create_connection, socket.getaddrinfo)
    with block_egress():
        assert socket.getaddrinfo is not originals[2]
    assert (socket.socket.connect, socket.create_connection, socket.getaddrinfo) == originals


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1", True),
        ("127.5.6.7", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        (None, True),
        ("10.0.0.1", False),
        ("93.184.216.34", False),
        ("huggingface.co", False),
        ("::ffff:8.8.8.8", False),
    ],
)
def test_is_local_address(host, local):
    assert is_local_address(host) is local


# --------------------------------------------------------------------------- offline mode


@pytest.fixture
def online_env(monkeypatch):
    """Start from an environment with every offline switch off (restored afterwards)."""
    from huggingface_hub import constants

    from hybridmem_local.weights.offline import OFFLINE_ENV

    for name in OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", False)
    return constants


def test_enforce_offline_sets_env_and_already_imported_hub_constants(online_env):
    import os

    import huggingface_hub

    from hybridmem_local.weights.offline import OFFLINE_ENV, enforce_offline, offline_status

    assert offline_status()["in_force"] is False
    assert enforce_offline() == OFFLINE_ENV
    assert {name: os.environ[name] for name in OFFLINE_ENV} == OFFLINE_ENV
    # huggingface_hub read HF_HUB_OFFLINE at import; transformers asks it via is_offline_mode()
    assert huggingface_hub.is_offline_mode() is True and online_env.HF_HUB_DISABLE_TELEMETRY is True
    assert enforce_offline() == OFFLINE_ENV  # idempotent
    assert offline_status()["in_force"] is True


def test_enforce_offline_can_be_waived_for_explicit_downloads(online_env):
    import os

    from hybridmem_local.weights.offline import OFFLINE_ENV, enforce_offline

    assert enforce_offline(allow_network=True) == {}
    assert not any(name in os.environ for name in OFFLINE_ENV)
    assert online_env.HF_HUB_OFFLINE is False


def test_offline_hub_call_makes_no_connection(online_env, no_egress, tmp_path):
    """Once offline mode is on, asking the hub for an uncached file fails locally, without egress."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    from hybridmem_local.weights.offline import enforce_offline

    enforce_offline()
    with pytest.raises(LocalEntryNotFoundError):
        hf_hub_download("sentence-transformers/all-MiniLM-L6-v2", "config.json", cache_dir=tmp_path)
    assert no_egress.attempts == []
