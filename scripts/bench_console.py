"""Console pages on a namespace of 100,000 memories: do they stay fast?

Fills a fresh store (hashing embedder, no LLM) with one session and N memories (1 in 10 an
episode) and their ``add`` events, inserted straight into the tables with ``executemany`` in one
transaction, builds the namespace's indexes once, signs in through FastAPI's TestClient and
times GETs of the pages (median of ``--repeat`` after one warm-up, and the warm-up itself):
the namespaces page, the memories list (first page, a deep page, a date-filtered page), a
memory's page and a search. Prints the CPU model with the timings.

    python scripts/bench_console.py                 # N = 100,000
    python scripts/bench_console.py --memories 10000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

NAMESPACE = "big"
START = datetime(2023, 1, 1, tzinfo=timezone.utc)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fill(memory, n: int) -> None:
    """One session of 10 turns, then ``n`` memories citing them and an ``add`` event each."""
    from hybridmem_local.schema import Session, Turn

    session = Session(
        namespace=NAMESPACE,
        session_id="s0",
        started_at=START,
        turns=[Turn(turn_id=f"s0:{i}", speaker="User", text=f"turn {i} about topic {i}") for i in range(10)],
    )
    memory.enqueue([session])
    store = memory.store
    now = datetime.now(timezone.utc).isoformat()
    first = int(store.scalar("SELECT coalesce(max(id), 0) FROM memories")) + 1
    rows, events = [], []
    for i in range(n):
        day = (START + timedelta(days=i % 900)).date().isoformat()
        episode = i % 10 == 0
        row = {
            "id": first + i,
            "namespace": NAMESPACE,
            "kind": "episode" if episode else "tuple",
            "title": f"Event {i}" if episode else None,
            "summary": f"User did thing {i} at place {i % 97}" if episode else None,
            "details": f"Details of thing {i}, with person {i % 53} at place {i % 97}." if episode else None,
            "entity": None if episode else f"person {i % 53}",
            "relation": None if episode else f"likes item {i % 31}",
            "object": None if episode else f"thing {i}",
            "context": None,
            "timestamp": day,
            "source_session_id": "s0",
            "source_turn_ids": json.dumps([f"s0:{i % 10}"]),
            "provenance": None,
            "created_at": now,
        }
        rows.append(row)
        events.append(
            {"namespace": NAMESPACE, "at": now, "action": "add", "memory_id": first + i, "after": json.dumps(row)}
        )
    with store.transaction() as c:
        c.executemany(
            "INSERT INTO memories (id, namespace, kind, title, summary, details, entity, relation, object, context, "
            "timestamp, source_session_id, source_turn_ids, provenance, created_at) VALUES (:id, :namespace, :kind, "
            ":title, :summary, :details, :entity, :relation, :object, :context, :timestamp, :source_session_id, "
            ":source_turn_ids, :provenance, :created_at)",
            rows,
        )
        c.executemany(
            "INSERT INTO events (namespace, at, action, memory_id, after) "
            "VALUES (:namespace, :at, :action, :memory_id, :after)",
            events,
        )
        c.execute("UPDATE sessions SET curation_status = 'curated' WHERE namespace = :ns", {"ns": NAMESPACE})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the service logs every request: only the table is printed

    from fastapi.testclient import TestClient

    from hybridmem_local.config import EmbedderConfig, load_config
    from hybridmem_local.embedding import build_embedder
    from hybridmem_local.service.app import create_app
    from hybridmem_local.service.state import ServiceState

    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(
            None,
            {
                "consolidation.every_n_sessions": 0,
                "service.rate_limit_per_s": 10_000.0,
                "service.rate_limit_burst": 10_000,
            },
        )
        state = ServiceState(
            Path(tmp) / "memory.db",
            config,
            embedder=build_embedder(EmbedderConfig(backend="hashing")),
            start_worker=False,
        )
        state.open()
        try:
            t0 = time.perf_counter()
            with state.memory() as memory:
                fill(memory, args.memories)
            fill_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            with state.memory() as memory:
                memory.rebuild_indexes(NAMESPACE)
            index_s = time.perf_counter() - t0
            token = state.keys.create([NAMESPACE], "admin")[1]
            client = TestClient(create_app(state), follow_redirects=False)
            form = client.get("/console/sign-in").text
            found = re.search(r'name="form_token" value="([^"]+)"', form)
            assert found is not None, form[:500]
            form_token = found.group(1)
            signed = client.post("/console/sign-in", data={"form_token": form_token, "api_key": token})
            assert signed.status_code == 303, signed.text
            with state.memory() as memory:
                last_id = int(memory.store.scalar("SELECT max(id) FROM memories"))
            base = f"/console/namespaces/{NAMESPACE}"
            deep = (args.memories // 50 - 1) * 50
            pages = {
                "namespaces": ("/console/namespaces", {}),
                "namespace overview": (base, {}),
                "memories, first page": (f"{base}/memories", {}),
                f"memories, offset {deep:,}": (f"{base}/memories", {"offset": deep}),
                "memories, dated 2024-06": (f"{base}/memories", {"since": "2024-06-01", "until": "2024-06-30"}),
                "memory page": (f"{base}/memories/{last_id - 5}", {}),
                "search": (f"{base}/memories", {"q": "person 7 likes item 3"}),
                "consolidation runs": (f"{base}/consolidation", {}),
            }
            print(f"CPU: {cpu_model()} ({platform.machine()}, Python {platform.python_version()})")
            print(f"store: {args.memories:,} memories in {NAMESPACE!r}; filled in {fill_s:.1f} s, ", end="")
            print(f"indexes built in {index_s:.1f} s")
            print(f"{'page':<28} {'first (ms)':>11} {'median (ms)':>12} {'bytes':>9}")
            for name, (path, params) in pages.items():
                t0 = time.perf_counter()
                answer = client.get(path, params=params)
                first_ms = 1000 * (time.perf_counter() - t0)
                assert answer.status_code == 200, (name, answer.status_code, answer.text[:500])
                times = []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    client.get(path, params=params)
                    times.append(1000 * (time.perf_counter() - t0))
                print(f"{name:<28} {first_ms:>11.1f} {statistics.median(times):>12.1f} {len(answer.content):>9,}")
        finally:
            state.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
