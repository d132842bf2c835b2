"""``hybridmem serve`` itself: loopback by default, ``--no-auth`` refused on a wider address."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from hybridmem_local.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "example.org"])
def test_no_auth_is_refused_on_a_non_loopback_host(tmp_path, host):
    db = tmp_path / "memory.db"
    result = runner.invoke(app, ["serve", "--no-auth", "--host", host, "--db", str(db)])
    assert result.exit_code == 1
    assert "--no-auth" in result.output and "loopback" in result.output
    assert not db.exists()  # refused before anything was opened


def test_no_auth_is_refused_when_the_config_widens_the_host(tmp_path):
    result = runner.invoke(app, ["serve", "--no-auth", "--set", "service.host=0.0.0.0", "--db", str(tmp_path / "m.db")])
    assert result.exit_code == 1 and "loopback" in result.output


def _listening(port: int) -> set[str]:
    """Local addresses with a socket listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A = LISTEN
                found.add(address)
    return found


@pytest.mark.slow
def test_serve_binds_loopback_by_default_and_answers(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    db = tmp_path / "memory.db"
    hybridmem = Path(sys.executable).with_name("hybridmem")
    created = subprocess.run(
        [str(hybridmem), "keys", "create", "-n", "alice", "--role", "read", "--db", str(db)],
        capture_output=True,
        text=True,
        check=True,
    )
    token = created.stdout.strip().splitlines()[-1]
    server = subprocess.Popen(
        [str(hybridmem), "serve", "--db", str(db), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ},
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, server.stdout.read()
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.5)
        assert _listening(port) == {"0100007F"}  # 127.0.0.1 only, nothing on 0.0.0.0 or ::
        headers = {"Authorization": f"Bearer {token}"}
        response = httpx.get(f"http://127.0.0.1:{port}/v1/namespaces/alice/stats", headers=headers, timeout=30)
        assert response.status_code == 200, response.text
    finally:
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=60)
    # uvicorn ends by re-raising the SIGTERM it handled (systemd counts that as a clean stop).
    assert server.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output and "Traceback" not in output
    # Every SQLite connection was closed (the last close removes the WAL): the state shut down cleanly.
    assert not Path(str(db) + "-wal").exists()
    assert token not in output
    assert "GET /v1/namespaces/{namespace}/stats 200 key=" in output  # the access line, without the key
