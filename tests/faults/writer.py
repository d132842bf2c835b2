"""Writer processes that tests can SIGKILL at any moment, without paying a model load per kill.

A *zygote* (``python -m tests.faults.writer``) loads the real MiniLM embedder once and then,
for each line of job specs on its stdin, forks one writer per job. A writer opens the store
with ``HybridMemory`` and the zygote's embedder (the fork shares the loaded weights), runs its
job, and appends a line to its progress file after every commit. The test kills writers by pid
and reads their exit statuses back from the zygote.

The zygote never runs the model before forking, so each writer starts torch's thread pools
itself (a pool inherited across ``fork`` could deadlock). Jobs:

* ``add_sessions`` — ``HybridMemory.add_memories(..., session=...)`` per curated session (one
  transaction each), index files saved after every session (``saves_per_session`` times), a
  search every few sessions;
* ``ingest`` — ``HybridMemory.ingest(sessions)`` with the configured LLM (curation), or raw
  (``curate: false``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- inside the writer


def _progress(spec: dict, line: str) -> None:
    # One write call per line (O_APPEND): a kill never leaves half a line.
    fd = os.open(spec["progress"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _job_add_sessions(memory, spec: dict) -> None:
    from tests.faults.corpus import QUERIES, read_curated

    items = read_curated(Path(spec["sessions"]))
    for namespace in sorted({c.session.namespace for c in items}):
        memory.search("warm up the indexes", namespace=namespace)  # loaded indexes follow every write
    for n, item in enumerate(items, start=1):
        memory.add_memories(item.session.namespace, episodes=item.episodes, tuples=item.tuples, session=item.session)
        _progress(spec, f"committed {item.session.namespace} {item.session.session_id}")
        for _ in range(spec.get("saves_per_session", 1)):
            memory.flush()
        if n % 3 == 0:
            memory.search(QUERIES[n % len(QUERIES)], namespace=item.session.namespace)


def _job_ingest(memory, spec: dict) -> None:
    from hybridmem_local.files.session_files import read_sessions_jsonl

    sessions = read_sessions_jsonl(Path(spec["sessions"]))
    report = memory.ingest(sessions, curate=spec.get("curate", True))
    _progress(spec, "report " + report.model_dump_json())


JOBS = {"add_sessions": _job_add_sessions, "ingest": _job_ingest}


def _run_job(embedder, spec: dict) -> int:
    import torch

    from hybridmem_local.config import load_config
    from hybridmem_local.memory import HybridMemory

    torch.set_num_threads(1)  # writers share 2 cores with the test and each other
    try:
        config = load_config(overrides=spec.get("overrides") or {})
        with HybridMemory.open(spec["db"], config, embedder=embedder) as memory:
            JOBS[spec["job"]](memory, spec)
        _progress(spec, "done")
        return 0
    except BaseException:  # everything a user would see: the test asserts there is nothing
        Path(spec["error"]).write_text(traceback.format_exc())
        return 1


def zygote_main() -> None:
    from hybridmem_local.config import EmbedderConfig
    from hybridmem_local.embedding import build_embedder

    embedder = build_embedder(EmbedderConfig(device="cpu"))
    print(json.dumps({"ready": embedder.model_id}), flush=True)
    for line in sys.stdin:
        specs = json.loads(line)
        pids = []
        for spec in specs:
            pid = os.fork()
            if pid == 0:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os._exit(_run_job(embedder, spec))
            pids.append(pid)
        print(json.dumps({"pids": pids}), flush=True)
        statuses = {}
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            statuses[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"statuses": statuses}), flush=True)


# --------------------------------------------------------------------------- test side


class Zygote:
    """Drives a zygote process: ``start(specs)`` forks writers, ``wait()`` returns exit codes
    (negative: killed by that signal)."""

    def __init__(self, log_path: Path, ready_timeout_s: float = 180):
        self._log = open(log_path, "w")  # noqa: SIM115 - the zygote's stderr for its whole life; close() shuts it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.writer"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._running: list[int] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.model_id = self._next(ready_timeout_s)["ready"]

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)

    def _next(self, timeout_s: float) -> dict[str, Any]:
        try:
            return json.loads(self._lines.get(timeout=timeout_s))
        except queue.Empty:
            raise AssertionError(f"zygote silent for {timeout_s}s (log: {self._log.name})") from None

    def start(self, specs: list[dict]) -> list[int]:
        if self._running:  # a failed test left writers behind: end them first
            for pid in self._running:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.wait()
        self.proc.stdin.write(json.dumps(specs) + "\n")
        self.proc.stdin.flush()
        self._running = self._next(30)["pids"]
        return self._running

    def wait(self, timeout_s: float = 300) -> dict[int, int]:
        statuses = {int(pid): code for pid, code in self._next(timeout_s)["statuses"].items()}
        self._running = []
        return statuses

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self._log.close()


def job(kind: str, db: Path, sessions: Path, workdir: Path, name: str, **extra) -> dict:
    """A job spec whose progress and error files live in ``workdir`` under ``name``."""
    return {
        "job": kind,
        "db": str(db),
        "sessions": str(sessions),
        "progress": str(workdir / f"{name}.progress"),
        "error": str(workdir / f"{name}.error"),
        **extra,
    }


def progress_lines(spec: dict) -> list[str]:
    path = Path(spec["progress"])
    return path.read_text().splitlines() if path.exists() else []


def error_text(spec: dict) -> str:
    path = Path(spec["error"])
    return path.read_text() if path.exists() else ""


if __name__ == "__main__":
    zygote_main()
