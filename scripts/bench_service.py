"""Load on ``hybridmem serve`` over loopback, and the curation worker's throughput.

**Load.** ``hybridmem serve`` runs as a subprocess on 127.0.0.1 over a store of ``--memories``
(default 10,000) memories. For each concurrency C (default 1, 8, 32), C client threads (httpx,
one connection each) loop for ``--duration`` seconds over a realistic mix: 90% search (a real
LoCoMo question, k = 10), 10% add a session (3 turns; 202, curated in the background). Reported
per C: throughput, search p50/p95/p99, errors (any non-2xx or transport error; target 0) and the
server's RSS. Against the same run's in-process ``HybridMemory.search()`` on the same file, timed
right before each level:

* ``in-process p95`` — one thread, back to back (the library's own latency);
* ``in-process C-thread p95`` — C threads sharing one HybridMemory under a lock, as the
  service does (a HybridMemory is not thread-safe), so queueing is the same on both sides.

The target (p95 ≤ 2× in-process at C = 8) is read against the C-thread figure: with searches
serialized on one store (and two cores), C closed-loop clients queue behind each other whether
or not HTTP is involved, so against one thread the ratio grows with C by queueing alone; both
ratios are printed.

The store is built once and kept (``runs/bench_service/``): memory texts are LoCoMo turns (or
synthetic sentences without LoCoMo), their vectors MiniLM paraphrases put straight into the
embedding cache (scripts/bench_search.py's ``build_store``: nothing embedded at build time);
each run works on a copy. The worker's LLM during the load run is an OpenAI-compatible stub on
loopback answering at once (tests/fake_vllm_server.py): what a remote ``vllm serve`` looks like
from this machine, so the run measures the service, not SmolLM2 sharing the cores.

**Curation.** ``--curation-sessions`` LoCoMo sessions curated by the worker on the llama.cpp
default (SmolLM2), once with ``curation.batch_sessions`` = all of them (one batch) and once
with 1 (one session at a time), on one loaded model (its constrained-decoding index built by a
warm-up first): sessions per minute each way. llama.cpp generates one request at a time, so on
it batching saves only per-batch overhead; the gain is on vLLM (continuous batching).

    python scripts/bench_service.py --out runs/bench_service.json            # 60 s per level
    python scripts/bench_service.py --duration 10 --levels 1 8 --curation-sessions 2
    python scripts/bench_service.py --no-curation
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import httpx
from rich.table import Table

# The sibling bench_search.py (timing and store helpers) and the repository (tests/fake_vllm_server.py),
# put on the path before the imports below (noqa: E402).
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from bench_search import (  # noqa: E402
    DEFAULT_CACHE,
    DEFAULT_LOCOMO,
    _pct,
    build_store,
    cached_embeddings,
    console,
    load_embedder,
    locomo_texts,
    machine,
    set_threads,
    summary,
    synthetic_vectors,
    timed,
    write_json,
)

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "runs" / "bench_service"
NAMESPACE = "bench"  # build_store's namespace
SEARCH_SHARE = 0.9
TARGET_RATIO_AT_8 = 2.0


# --------------------------------------------------------------------------- the store


def synthetic_turns(n: int = 3000) -> list[tuple[str, str]]:
    """(speaker, sentence) pairs standing in for LoCoMo turns when the dev file is absent."""
    rng = random.Random(0)
    people = ["Ann", "Ben", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal"]
    verbs = ["bought", "visited", "painted", "sold", "repaired", "photographed", "borrowed", "planned"]
    things = ["a kayak", "a violin", "the garden", "a novel", "a camera", "a tent", "a guitar", "a quilt"]
    places = ["Paris", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Bern"]
    return [
        (
            rng.choice(people),
            f"Last {rng.choice(['week', 'month', 'year'])} I {rng.choice(verbs)} "
            f"{rng.choice(things)} in {rng.choice(places)} ({i}).",
        )
        for i in range(n)
    ]


def prepared_store(n: int, locomo: Path, embedder) -> tuple[Path, list[str]]:
    """The kept store of ``n`` memories (built on first use) and the queries to send."""
    if locomo.exists():
        turns, questions = locomo_texts(locomo)
        source = "locomo"
    else:
        turns = synthetic_turns()
        questions = [
            f"What did {who} do in {place}?" for who in ("Ann", "Ben", "Eve") for place in ("Oslo", "Lima", "Bern")
        ]
        source = "synthetic"
    db = WORK / f"store_{source}_{n}.db"
    if not db.exists():
        # The same base vectors as scripts/bench_search.py, kept in its cache.
        base = cached_embeddings(embedder, [t for _, t in turns], DEFAULT_CACHE, f"{source}_turns")
        vectors, sources = synthetic_vectors(base, n, "paraphrase")
        WORK.mkdir(parents=True, exist_ok=True)
        partial = db.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        built = build_store(partial, embedder.model_id, turns, vectors, sources)
        partial.rename(db)
        console.print(f"built {db} ({built['memories']:,} memories in {built['insert_s']:.1f}s)")
    return db, questions


def working_copy(db: Path, folder: Path) -> Path:
    copy = folder / "service.db"
    shutil.copy(db, copy)
    return copy


# --------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db: Path, overrides: dict, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    command = [
        str(Path(sys.executable).parent / "hybridmem"),
        "serve",
        "--db",
        str(db),
        "--port",
        str(port),
        "--no-auth",
        *sets,
    ]
    # One torch thread, as in-process (set_threads(1)): the cores are shared with the clients.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "ab") as output:  # the child writes through its own copy of the descriptor
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"hybridmem serve exited {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                return process, base_url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"hybridmem serve not ready after 300 s: {log.read_text()[-2000:]}")


def rss_mb(pid: int) -> dict:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"rss_mb": int(fields["VmRSS"].split()[0]) / 1024, "peak_rss_mb": int(fields["VmHWM"].split()[0]) / 1024}


# --------------------------------------------------------------------------- one load level


def client(index: int, base_url: str, questions: list[str], stop_at: float, out: dict, lock: threading.Lock) -> None:
    rng = random.Random(index)
    searches, adds, errors = [], [], []
    n = 0
    with httpx.Client(base_url=base_url, timeout=120) as http:
        while time.monotonic() < stop_at:
            n += 1
            try:
                if rng.random() < SEARCH_SHARE:
                    seconds, response = timed(
                        partial(
                            http.post,
                            f"/v1/namespaces/{NAMESPACE}/search",
                            json={"query": rng.choice(questions), "k": 10},
                        )
                    )
                    searches.append(seconds)
                else:
                    sid = f"load-{index}-{n}-{time.time_ns()}"
                    body = {
                        "session_id": sid,
                        "started_at": datetime.now(timezone.utc).isoformat(),
                        "turns": [
                            {"turn_id": f"{sid}:{i}", "speaker": "Ann", "text": f"{rng.choice(questions)} Answer {i}."}
                            for i in range(3)
                        ],
                    }
                    seconds, response = timed(partial(http.post, f"/v1/namespaces/{NAMESPACE}/sessions", json=body))
                    adds.append(seconds)
                if response.status_code >= 300:
                    errors.append(f"{response.status_code} {response.text[:200]}")
            except httpx.HTTPError as exc:
                errors.append(repr(exc))
    with lock:
        out["search"] += searches
        out["add"] += adds
        out["errors"] += errors


def load_level(base_url: str, concurrency: int, duration_s: float, questions: list[str]) -> dict:
    out: dict = {"search": [], "add": [], "errors": []}
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s
    started = time.perf_counter()
    threads = [
        threading.Thread(target=client, args=(i, base_url, questions, stop_at, out, lock)) for i in range(concurrency)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    search_ms = sorted(s * 1000 for s in out["search"])
    return {
        "concurrency": concurrency,
        "seconds": elapsed,
        "requests": len(out["search"]) + len(out["add"]),
        "throughput_rps": (len(out["search"]) + len(out["add"])) / elapsed,
        "search": {**summary(out["search"]), "p99_ms": _pct(search_ms, 99)},
        "add_session": summary(out["add"]) if out["add"] else None,
        "errors": len(out["errors"]),
        "error_samples": out["errors"][:5],
    }


def in_process(memory, questions: list[str], concurrency: int, duration_s: float) -> dict:
    """``search()`` latency in this process on the same file: C threads under one lock, like the service."""
    lock = threading.Lock()
    seconds: list[float] = []
    stop_at = time.monotonic() + duration_s

    def loop(index: int) -> None:
        rng = random.Random(1000 + index)
        mine = []
        while time.monotonic() < stop_at:
            query = rng.choice(questions)
            start = time.perf_counter()
            with lock:
                memory.search(query, namespace=NAMESPACE, k=10)
            mine.append(time.perf_counter() - start)
        seconds.extend(mine)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ms = sorted(s * 1000 for s in seconds)
    return {**summary(seconds), "p99_ms": _pct(ms, 99)}


def bench_load(args, embedder) -> dict:
    from hybridmem_local.config import load_config
    from hybridmem_local.memory import HybridMemory
    from tests.fake_vllm_server import ChatServer, curation_reply

    kept, questions = prepared_store(args.memories, args.locomo, embedder)
    folder = WORK / f"run-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    db = working_copy(kept, folder)
    llm = ChatServer(lambda body, attempt: curation_reply(body))
    overrides = llm.overrides(
        **{
            "retrieval.mode": args.mode,
            "service.rate_limit_per_s": 1_000_000,
            "service.rate_limit_burst": 1_000_000,
            "service.max_pending_sessions": 1_000_000,
            "consolidation.every_n_sessions": 0,
        }
    )
    process, base_url = start_server(db, overrides, folder / "serve.log")
    levels = []
    try:
        with (
            HybridMemory.open(db, load_config(None, {"retrieval.mode": args.mode}), embedder=embedder) as memory,
            httpx.Client(base_url=base_url, timeout=300) as http,
        ):
            for question in questions[:5]:  # both sides load their indexes before anything is timed
                memory.search(question, namespace=NAMESPACE)
                http.post(f"/v1/namespaces/{NAMESPACE}/search", json={"query": question, "k": 10}).raise_for_status()
            for concurrency in args.levels:
                console.print(f"[bold]C = {concurrency}[/]: in-process, then {args.duration:.0f}s over HTTP")
                single = in_process(memory, questions, 1, args.in_process_s)
                shared = in_process(memory, questions, concurrency, args.in_process_s)
                level = load_level(base_url, concurrency, args.duration, questions)
                level.update(rss_mb(process.pid))
                level["in_process"] = single
                level["in_process_c_threads"] = shared
                level["p95_over_in_process"] = level["search"]["p95_ms"] / single["p95_ms"]
                level["p95_over_in_process_c_threads"] = level["search"]["p95_ms"] / shared["p95_ms"]
                levels.append(level)
            worker = http.get("/readyz").json().get("worker")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
        llm.stop()
    result = {
        "memories": args.memories,
        "mode": args.mode,
        "store": str(kept),
        "duration_s": args.duration,
        "levels": levels,
        "worker_after": worker,
        "target_p95_ratio_at_8": TARGET_RATIO_AT_8,
    }
    if not args.keep_run:
        shutil.rmtree(folder)
    return result


# --------------------------------------------------------------------------- curation throughput


def bench_curation(args, embedder) -> dict:
    from hybridmem_local.config import load_config
    from hybridmem_local.eval.locomo import load_locomo
    from hybridmem_local.llm import build_llm
    from hybridmem_local.schema import Session
    from hybridmem_local.service.state import ServiceState

    if not args.locomo.exists():
        return {"skipped": f"no LoCoMo file at {args.locomo}"}
    conversation = load_locomo(args.locomo).conversations[0]
    sessions = [
        Session(
            session_id=s.session_id, namespace="curation", started_at=s.started_at, turns=s.turns[: args.curation_turns]
        )
        for s in conversation.sessions[: args.curation_sessions + 1]
    ]
    warm_up, sessions = sessions[0], sessions[1:]
    overrides = {"consolidation.every_n_sessions": 0}
    if args.curation_max_new_tokens:
        overrides["llm.max_new_tokens"] = args.curation_max_new_tokens
    base = load_config(None, overrides)
    # One model for both runs and no call cache: the second run must not get the first one's replies.
    started = time.perf_counter()
    llm = build_llm(base.llm)
    load_s = time.perf_counter() - started
    results: dict = {
        "model": llm.model_id,
        "sessions": len(sessions),
        "turns_per_session": args.curation_turns,
        "max_new_tokens": base.llm.max_new_tokens,
        "model_load_s": load_s,
    }
    runs = [("warm_up", [warm_up], 1), ("batched", sessions, len(sessions)), ("one_at_a_time", sessions, 1)]
    for name, chunk, batch in runs:
        config = base.model_copy(update={"curation": base.curation.model_copy(update={"batch_sessions": batch})})
        folder = WORK / f"curation-{name}-{os.getpid()}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        with ServiceState(folder / "m.db", config, embedder=embedder, llm=llm) as state:
            started = time.perf_counter()
            state.enqueue(chunk)
            while state.worker.status().pending:
                time.sleep(0.2)
            seconds = time.perf_counter() - started
            status = state.worker.status()
        shutil.rmtree(folder)
        results[name] = {
            "seconds": seconds,
            "batch_sessions": batch,
            "batches": status.batches,
            "curated": status.sessions_curated,
            "failed": status.sessions_failed,
            "memories": status.memories,
            "sessions_per_min": 60 * len(chunk) / seconds,
        }
        console.print(f"curation {name}: {len(chunk)} session(s) in {seconds:.1f}s ({status.batches} batch(es))")
    results["batched_speedup"] = results["one_at_a_time"]["seconds"] / results["batched"]["seconds"]
    return results


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load per concurrency level")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32], help="concurrent clients")
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument(
        "--mode",
        choices=["hybrid", "dense", "lexical"],
        default="hybrid",
        help="retrieval.mode on both sides (hybrid: the default; its BM25 index rebuilds after every write)",
    )
    parser.add_argument(
        "--in-process-s", type=float, default=10.0, help="seconds of in-process search before each level"
    )
    parser.add_argument("--curation-sessions", type=int, default=4)
    parser.add_argument("--curation-turns", type=int, default=8, help="turns kept of each curated session")
    parser.add_argument("--curation-max-new-tokens", type=int, default=None, help="override llm.max_new_tokens")
    parser.add_argument("--no-curation", action="store_true")
    parser.add_argument("--no-load", action="store_true")
    parser.add_argument("--keep-run", action="store_true", help="keep the working copy and the server log")
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    info = machine()
    set_threads(1)
    embedder = load_embedder()
    results: dict = {"machine": info}
    if not args.no_load:
        results["load"] = bench_load(args, embedder)
    if not args.no_curation:
        results["curation"] = bench_curation(args, embedder)
    results["machine"]["load_average_at_end"] = os.getloadavg()
    print_tables(results)
    write_json(args.out, results)


def print_tables(results: dict) -> None:
    if "load" in results:
        load = results["load"]
        table = Table(
            title=f"hybridmem serve on loopback · {load['memories']:,} memories · 90% search / 10% add session · "
            f"{load['duration_s']:.0f}s per level · retrieval {load['mode']}"
        )
        for column in (
            "C",
            "req/s",
            "search p50",
            "p95",
            "p99",
            "in-proc p95 (1 thr)",
            "ratio",
            "in-proc p95 (C thr)",
            "ratio",
            "add p95",
            "errors",
            "RSS MB",
        ):
            table.add_column(column, justify="right")
        for level in load["levels"]:
            s = level["search"]
            table.add_row(
                str(level["concurrency"]),
                f"{level['throughput_rps']:.1f}",
                f"{s['p50_ms']:.1f}",
                f"{s['p95_ms']:.1f}",
                f"{s['p99_ms']:.1f}",
                f"{level['in_process']['p95_ms']:.1f}",
                f"{level['p95_over_in_process']:.2f}×",
                f"{level['in_process_c_threads']['p95_ms']:.1f}",
                f"{level['p95_over_in_process_c_threads']:.2f}×",
                f"{level['add_session']['p95_ms']:.1f}" if level["add_session"] else "-",
                str(level["errors"]),
                f"{level['rss_mb']:.0f}",
            )
        console.print(table)
    curation = results.get("curation")
    if curation and "batched" in curation:
        table = Table(
            title=f"curation by the worker · {curation['model']} · {curation['sessions']} sessions × "
            f"{curation['turns_per_session']} turns · max_new_tokens {curation['max_new_tokens']}"
        )
        for column in ("mode", "batch", "batches", "seconds", "sessions/min", "curated", "failed", "memories"):
            table.add_column(column, justify="right")
        for name in ("batched", "one_at_a_time"):
            r = curation[name]
            table.add_row(
                name,
                str(r["batch_sessions"]),
                str(r["batches"]),
                f"{r['seconds']:.1f}",
                f"{r['sessions_per_min']:.2f}",
                str(r["curated"]),
                str(r["failed"]),
                str(r["memories"]),
            )
        console.print(table)
        console.print(f"batched / one at a time: {curation['batched_speedup']:.2f}× faster")
    elif curation:
        console.print(f"curation: {json.dumps(curation)}")


if __name__ == "__main__":
    main()
