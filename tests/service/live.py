"""Servers for the service tests: the FastAPI app on uvicorn in a thread of the test, and
``hybridmem serve`` and ``hybridmem worker`` as subprocesses that a test can SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


class ThreadedServer:
    """uvicorn serving ``app`` on 127.0.0.1 (a free port) in a thread, stopped by ``should_exit``."""

    def __init__(self, app):
        import uvicorn

        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
        )
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self._thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveProcess:
    """A ``hybridmem`` command in a process of its own, its output appended to ``log``; stopped by
    its PID (SIGKILL or SIGTERM). ``overrides`` become ``--set key=value`` options. The process runs
    one torch thread: the tests share two cores with it."""

    def __init__(self, command: list[str], db: Path, overrides: dict, log: Path, args: Sequence[str] = ()):
        self.db = db
        sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
        command = [str(Path(sys.executable).parent / "hybridmem"), *command, "--db", str(db), *args, *sets]
        self._log = open(log, "ab")  # noqa: SIM115 - the process's output for its whole life; kill() and terminate() close it
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.log_path = log

    @property
    def pid(self) -> int:
        return self.process.pid

    def _assert_running(self) -> None:
        assert self.process.poll() is None, (
            f"{self.process.args[1]} exited {self.process.returncode}:\n{self.log_path.read_text()[-3000:]}"
        )

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        self._log.close()

    def terminate(self, timeout_s: float = 60) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout_s)
        self._log.close()
        return code


class ServeProcess(LiveProcess):
    """``hybridmem serve --no-auth`` on a loopback port; ``args`` are more options of ``serve``
    (``--no-worker`` for a replica beside ``hybridmem worker`` processes)."""

    def __init__(self, db: Path, overrides: dict, log: Path, args: Sequence[str] = ()):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        super().__init__(["serve"], db, overrides, log, ["--port", str(self.port), "--no-auth", *args])

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._assert_running()
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"serve not ready after {timeout_s}s:\n{self.log_path.read_text()[-3000:]}")


class WorkerProcess(LiveProcess):
    """``hybridmem worker``: curates the store's queue beside other workers and replicas. Its
    claims name it by its PID (``CurationWorker.name`` is ``host:pid:random``)."""

    #: What the command prints once its worker thread runs.
    READY = b"curating"

    def __init__(self, db: Path, overrides: dict, log: Path, args: Sequence[str] = ()):
        super().__init__(["worker"], db, overrides, log, args)

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._assert_running()
            if self.READY in self.log_path.read_bytes():
                return
            time.sleep(0.1)
        raise AssertionError(f"worker not ready after {timeout_s}s:\n{self.log_path.read_text()[-3000:]}")
