"""A real ``hybridmem serve`` stack for the HTTP tests: ServiceState + create_app on uvicorn,
bound to 127.0.0.1 on a free port in a thread of the test process (so the session's embedder is
shared), stopped through uvicorn's ``should_exit``.
"""

from __future__ import annotations

import hashlib
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from hybridmem_local.config import Config, load_config
from hybridmem_local.service.app import create_app
from hybridmem_local.service.state import ServiceState
from tests.tiny_model import tiny_llm_config

STARTED_AT = datetime(2023, 5, 7, 10, 0, tzinfo=timezone.utc)


@dataclass
class LiveService:
    url: str
    state: ServiceState
    db: Path

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kwargs)


def service_config(tiny_llm: bool, **overrides: Any) -> Config:
    """Defaults and dotted ``overrides``; with ``tiny_llm`` the tiny model's limits (1k-token context)."""
    config = load_config(None, overrides)
    return config.model_copy(update={"llm": tiny_llm_config(max_new_tokens=64)}) if tiny_llm else config


@contextmanager
def live_service(
    db: Path, embedder: Any, llm: Any, *, require_auth: bool = True, start_worker: bool = True, **overrides: Any
) -> Iterator[LiveService]:
    """``llm=None``: the state builds the configured default (llama.cpp SmolLM2), as ``serve`` does."""
    config = service_config(llm is not None, **overrides)
    state = ServiceState(db, config, embedder=embedder, llm=llm, start_worker=start_worker)
    state.open()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(state, require_auth=require_auth), log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield LiveService(url=f"http://127.0.0.1:{port}", state=state, db=db)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        state.close()
        assert not thread.is_alive(), "uvicorn did not stop"


def store_snapshot(db: Path) -> dict[str, str]:
    """A digest of every row of every table, read on a connection of its own: equal snapshots
    mean nothing stored changed. The audit trail is left out: every request, refused or not,
    adds its entry there (tests/service/test_audit.py checks those)."""
    conn = sqlite3.connect(db)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {
            table: hashlib.sha256(
                repr(conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()).encode()
            ).hexdigest()
            for table in tables
            if table not in ("sqlite_sequence", "audit_log", "audit_anchor")
        }
    finally:
        conn.close()


def session_body(session_id: str, texts: list[str], prefix: str | None = None) -> dict[str, Any]:
    prefix = prefix or session_id
    return {
        "session_id": session_id,
        "started_at": STARTED_AT.isoformat(),
        "turns": [
            {"turn_id": f"{prefix}:{i}", "speaker": "Alice" if i % 2 == 0 else "Bob", "text": text}
            for i, text in enumerate(texts)
        ],
    }


def wait_for_curation(client: httpx.Client, status_url: str, timeout_s: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        record = client.get(status_url).json()
        if record["curation_status"] != "pending" or time.monotonic() > deadline:
            return record
        time.sleep(0.2)
