"""Replicas and workers on one PostgreSQL store against one SQLite ``hybridmem serve``, in one run (issue #34 item 6).

**Load (a).** The same load on five set-ups, each started fresh on the same pre-filled store of
``--memories`` memories (namespace ``bench``): one ``hybridmem serve --no-worker`` on a copy of a
SQLite file (the baseline), then 1, 2 and 4 ``hybridmem serve --no-worker`` replicas on one
PostgreSQL database (a fresh ``CREATE DATABASE … TEMPLATE`` of the pre-filled one for each count).
``--threads`` client threads (httpx, one connection each) are spread round-robin over the
replicas and loop for ``--duration`` seconds over a fixed mix: ``--search-share`` (80%) search
(k = 10, a LoCoMo question), the rest split evenly between add memories (one episode and one tuple,
201) and add session (3 turns, 202, left pending). Reported per set-up: requests/s, search
p50/p95/p99, write p95, errors (any non-2xx or transport error; target 0), each replica's first
(index-building) search, RSS, and the CPU seconds the replicas and the PostgreSQL server spent
during the timed window (and per request: what a replica's share of the work costs when the
cores are saturated); then as ratios to the SQLite baseline (requests/s and search p95) and
to one PostgreSQL replica (requests/s).

No set-up runs a curation worker (the SQLite baseline is ``--no-worker`` too), so both sides do
the same work: the sessions added stay pending. Every process runs one torch thread
(``OMP_NUM_THREADS=1``, tests/service/live.py's ServeProcess and WorkerProcess) and the hashing
embedder (``embedder.backend=hashing``), so the model does not dominate; retrieval is the default
hybrid mode (``--mode``), audit on (the default). Each replica keeps its index files in a folder of
its own (``store.local_dir``), as on different hosts, and builds them from the store at its
first search (timed apart, before the window).

**Curation (b).** ``--curation-sessions`` pending sessions (3 turns each) are enqueued at once on a
fresh PostgreSQL database under 1, then 2 ``hybridmem worker`` processes (started and warmed up
first), and timed until none is pending. The LLM is the fake ``vllm serve`` of the service tests
(tests/fake_vllm_server.py: ChatServer, curation_reply), answering every curation request after
``--llm-delay`` seconds, so this measures the store and the queue (claims with ``FOR UPDATE SKIP
LOCKED``, leases, the writes) at a fixed LLM latency: with it, 2 workers should approach 2×.
Checked and reported: every session curated, none holding a memory twice (curated twice) or
none (lost); at most 1 + 3 memories each (the curator's own filter may drop one of a reply's).

**The database.** By default a throwaway PostgreSQL server (tests/postgres_cluster.py's
PostgresCluster: ``initdb`` into a temporary directory, a free 127.0.0.1 port, ``fsync=off``,
run as the ``postgres`` user when root) is started for the run and stopped by its PID at the
end, even on error. ``--postgres-url URL`` uses a running server instead: the URL's user must
be allowed to create databases; the run creates and drops databases named ``bench_replicas_*``.
Every ``hybridmem`` process binds 127.0.0.1 on a free port and is stopped by its PID.

**Reading it.** Everything (clients, replicas, workers, PostgreSQL) shares this machine's cores:
on a 2-core machine (or under ``taskset -c 1``) more replicas cannot add CPU, so the replica
ratios measure the cost of sharing one database (connections, the change counter each replica
checks, each replica's own index upkeep), not scale-out; the JSON records the CPU model, the
core count and the CPUs this run was allowed (``sched_getaffinity``).

    python scripts/bench_replicas.py                               # full: 45 s per set-up, ~7 min
    python scripts/bench_replicas.py --quick --out runs/bench_replicas_quick.json   # smoke, < 2 min
    python scripts/bench_replicas.py --postgres-url postgresql+psycopg://me@db:5432/postgres
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from datetime import date, datetime, timedelta, timezone
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import httpx
from rich.table import Table

# The sibling benches (timing, output and load helpers) and the repository (the tests' servers),
# put on the path before the imports below (noqa: E402).
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from bench_search import DEFAULT_LOCOMO, _pct, console, locomo_texts, machine, summary, timed, write_json  # noqa: E402
from bench_service import rss_mb, synthetic_turns  # noqa: E402

from tests.fake_vllm_server import ChatServer, Sleep, curation_reply  # noqa: E402
from tests.service.live import LiveProcess, ServeProcess, WorkerProcess  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "runs" / "bench_replicas"
DEFAULT_OUT = REPO / "docs" / "results" / "bench_replicas.json"
NAMESPACE = "bench"
CURATION_NAMESPACE = "curation"
TURNS = 3  # per session added by a client or enqueued for curation
MEMORIES_PER_SESSION = 1 + TURNS  # curation_reply: one episode per window, one tuple per turn
DB_PREFIX = "bench_replicas"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- texts


def texts(locomo: Path) -> tuple[str, list[tuple[str, str]], list[str]]:
    """(source, (speaker, text) turns, questions): LoCoMo's dev file, else synthetic sentences."""
    if locomo.exists():
        turns, questions = locomo_texts(locomo)
        return "locomo", turns, questions
    questions = [
        f"What did {who} do in {place}?" for who in ("Ann", "Ben", "Eve") for place in ("Oslo", "Lima", "Bern")
    ]
    return "synthetic", synthetic_turns(), questions


def memory_drafts(turns: list[tuple[str, str]], start: int, count: int) -> tuple[list[dict], list[dict]]:
    """Memories ``start`` .. ``start + count`` as drafts (episodes and tuples, alternately): turn
    texts cycled, each with its number so no two are the same."""
    episodes, tuples = [], []
    for i in range(start, start + count):
        speaker, text = turns[i % len(turns)]
        when = (date(2023, 1, 1) + timedelta(days=i % 365)).isoformat()
        text = f"{text} (note {i})"
        if i % 2 == 0:
            episodes.append(
                {"title": f"{speaker}: {text[:40]}", "summary": text[:160], "details": text, "timestamp": when}
            )
        else:
            tuples.append({"entity": speaker, "relation": "said", "object": text[:200], "timestamp": when})
    return episodes, tuples


def prefill(location: str, overrides: dict, turns: list[tuple[str, str]], n: int) -> float:
    """Store ``n`` memories in ``location`` (a SQLite path or a PostgreSQL URL) in batches; seconds."""
    from hybridmem_local.config import load_config
    from hybridmem_local.memory import HybridMemory
    from hybridmem_local.schema import EpisodeDraft, TupleDraft

    started = time.perf_counter()
    with HybridMemory.open(location, load_config(None, overrides)) as memory:
        for start in range(0, n, 500):
            episodes, tuples = memory_drafts(turns, start, min(500, n - start))
            memory.add_memories(NAMESPACE, [EpisodeDraft(**e) for e in episodes], [TupleDraft(**t) for t in tuples])
    return time.perf_counter() - started


# --------------------------------------------------------------------------- PostgreSQL


def pg_conninfo(url: str) -> str:
    """psycopg's form of a SQLAlchemy URL."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


class Databases:
    """Databases of one PostgreSQL server, created and dropped through ``admin_url`` (a database
    to connect to for CREATE/DROP DATABASE; the throwaway cluster's ``postgres``)."""

    def __init__(self, admin_url: str, pid: int | None):
        from sqlalchemy.engine import make_url

        self.admin_url = admin_url
        self._url = make_url(admin_url)
        self.pid = pid  # the postmaster's, for CPU accounting (None for a server given by URL)
        self.created: list[str] = []

    def url(self, name: str) -> str:
        return self._url.set(database=name).render_as_string(hide_password=False)

    def admin(self, query, params: tuple = ()) -> list[tuple]:
        import psycopg

        with psycopg.connect(pg_conninfo(self.admin_url), autocommit=True) as conn:
            cursor = conn.execute(query, params or None)
            return cursor.fetchall() if cursor.description else []

    def create(self, name: str, template: str | None = None) -> str:
        """A new database (a copy of ``template``, which nobody may be connected to); its URL."""
        from psycopg import errors, sql

        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            query = sql.SQL("{} TEMPLATE {}").format(query, sql.Identifier(template))
        for attempt in range(50):  # a closed pool's backends take a moment to exit
            try:
                self.admin(query)
                break
            except errors.ObjectInUse:
                if attempt == 49:
                    raise
                time.sleep(0.1)
        self.created.append(name)
        return self.url(name)

    def drop_all(self) -> None:
        from psycopg import sql

        for name in reversed(self.created):
            self.admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        self.created.clear()

    def server_version(self) -> str:
        return self.admin("SHOW server_version")[0][0]


@contextmanager
def postgres_server(url: str | None):
    """Databases on the server at ``url``, or on a throwaway cluster stopped (by PID) on the way out."""
    cluster = None
    if url is None:
        from tests.postgres_cluster import PostgresCluster

        cluster = PostgresCluster().start()
        url = cluster.url_for("postgres")
    databases = Databases(url, cluster.pid if cluster else None)
    try:
        yield databases
    finally:
        try:
            if cluster is None:
                databases.drop_all()
        finally:
            if cluster is not None:
                cluster.stop()


# --------------------------------------------------------------------------- processes


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def postgres_pids(postmaster: int | None) -> list[int]:
    """The postmaster and its children (the backends, each in a session of its own)."""
    if postmaster is None:
        return []
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(postmaster):
                    children.append(int(entry.name))
            except OSError:
                pass
    return [postmaster, *children]


def cpu_snapshot(pids: list[int]) -> dict[int, float]:
    return {pid: proc_cpu_s(pid) for pid in pids}


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def stop_processes(processes: list[LiveProcess]) -> dict[str, int | None]:
    """SIGTERM each by its PID (SIGKILL if it does not end in 30 s); their exit codes."""
    codes: dict[str, int | None] = {}
    for process in processes:
        if process.process.poll() is not None:
            codes[process.log_path.name] = process.process.returncode
            continue
        try:
            codes[process.log_path.name] = process.terminate(30)
        except Exception:  # noqa: BLE001 - a hung process: killed by its PID
            process.kill()
            codes[process.log_path.name] = process.process.returncode
    return codes


def start_all(processes: list) -> float:
    """Wait until each started process is ready; seconds from now."""
    started = time.perf_counter()
    for process in processes:
        process.wait_ready(300)
    return time.perf_counter() - started


# --------------------------------------------------------------------------- the load


def request_for(kind: str, rng: random.Random, turns, questions, tag: str) -> tuple[str, dict]:
    """(path, body) of one request of ``kind``."""
    if kind == "search":
        return "search", {"query": rng.choice(questions), "k": 10}
    if kind == "add_memories":
        episodes, tuples = memory_drafts(turns, rng.randrange(10**6, 10**7), 2)
        return "memories", {"episodes": episodes, "tuples": tuples}
    body = {
        "session_id": tag,
        "started_at": datetime.now(timezone.utc).isoformat(),
        "turns": [
            {"turn_id": f"{tag}:{i}", "speaker": speaker, "text": text}
            for i, (speaker, text) in enumerate(rng.sample(turns, TURNS))
        ],
    }
    return "sessions", body


def client(index: int, urls: list[str], setup: str, args, turns, questions, stop_at: float, out: dict, lock) -> None:
    """One client thread on replica ``index % len(urls)``, looping over the mix until ``stop_at``."""
    rng = random.Random(index)
    write_share = (1 - args.search_share) / 2
    seconds: dict[str, list[float]] = {"search": [], "add_memories": [], "add_session": []}
    errors: list[str] = []
    n = 0
    with httpx.Client(base_url=urls[index % len(urls)], timeout=120) as http:
        while time.monotonic() < stop_at:
            n += 1
            draw = rng.random()
            kind = (
                "search"
                if draw < args.search_share
                else "add_memories"
                if draw < args.search_share + write_share
                else "add_session"
            )
            path, body = request_for(kind, rng, turns, questions, f"{setup}-{index}-{n}")
            try:
                elapsed, response = timed(partial(http.post, f"/v1/namespaces/{NAMESPACE}/{path}", json=body))
                seconds[kind].append(elapsed)
                if response.status_code >= 300:
                    errors.append(f"{kind} {response.status_code} {response.text[:200]}")
            except httpx.HTTPError as exc:
                errors.append(f"{kind} {exc!r}")
    with lock:
        for kind, values in seconds.items():
            out[kind] += values
        out["errors"] += errors
        out["per_replica"][index % len(urls)] += n


def run_load(urls: list[str], setup: str, args, turns, questions) -> dict:
    """``args.threads`` clients round-robin over ``urls`` for ``args.duration`` seconds (as bench_service's
    load_level, which drives one server)."""
    out: dict = {"search": [], "add_memories": [], "add_session": [], "errors": [], "per_replica": [0] * len(urls)}
    lock = threading.Lock()
    stop_at = time.monotonic() + args.duration
    started = time.perf_counter()
    threads = [
        threading.Thread(target=client, args=(i, urls, setup, args, turns, questions, stop_at, out, lock))
        for i in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    requests = sum(len(out[k]) for k in ("search", "add_memories", "add_session"))
    search_ms = sorted(s * 1000 for s in out["search"])
    writes = out["add_memories"] + out["add_session"]
    return {
        "seconds": elapsed,
        "requests": requests,
        "throughput_rps": requests / elapsed,
        "search": {**summary(out["search"]), "p99_ms": _pct(search_ms, 99)},
        "add_memories": summary(out["add_memories"]) if out["add_memories"] else None,
        "add_session": summary(out["add_session"]) if out["add_session"] else None,
        "writes": summary(writes) if writes else None,
        "requests_per_replica": out["per_replica"],
        "errors": len(out["errors"]),
        "error_samples": out["errors"][:5],
    }


def first_searches(servers: list[ServeProcess], questions: list[str]) -> list[float]:
    """Each replica's first search (it builds its indexes from the store), then a few more; seconds of the first."""
    firsts = []
    for server in servers:
        with httpx.Client(base_url=server.base_url, timeout=300) as http:
            for n, question in enumerate(questions[:5]):
                seconds, response = timed(
                    partial(http.post, f"/v1/namespaces/{NAMESPACE}/search", json={"query": question, "k": 10})
                )
                response.raise_for_status()
                if n == 0:
                    firsts.append(seconds)
    return firsts


def load_setup(name: str, servers: list[ServeProcess], postmaster: int | None, args, turns, questions) -> dict:
    """Start ``servers``, warm each up, run the load, stop them by PID: the set-up's figures."""
    try:
        ready_s = start_all(servers)
        first = first_searches(servers, questions)
        console.print(
            f"[bold]{name}[/]: {len(servers)} process(es) ready in {ready_s:.1f}s, {args.duration:.0f}s of load"
        )
        pids = [s.pid for s in servers]
        before_servers, before_pg, before_self = cpu_snapshot(pids), cpu_snapshot(postgres_pids(postmaster)), os.times()
        result = run_load([s.base_url for s in servers], name, args, turns, questions)
        after_self = os.times()
        result["cpu_s"] = {
            "replicas": cpu_delta(before_servers, cpu_snapshot(pids)),
            "postgres": cpu_delta(before_pg, cpu_snapshot(postgres_pids(postmaster))) if postmaster else None,
            "clients": (after_self.user - before_self.user) + (after_self.system - before_self.system),
        }
        server_cpu = result["cpu_s"]["replicas"] + (result["cpu_s"]["postgres"] or 0.0)
        result["server_cpu_ms_per_request"] = 1000 * server_cpu / max(result["requests"], 1)
        result["rss_mb"] = [rss_mb(pid)["rss_mb"] for pid in pids]
        result.update(processes=len(servers), ready_s=ready_s, first_search_s=first)
    finally:
        codes = stop_processes(servers)
    result["exit_codes"] = codes
    return result


def bench_load(args, databases: Databases, folder: Path, llm: ChatServer, turns, questions) -> dict:
    common = llm.overrides(
        **{
            "embedder.backend": "hashing",
            "retrieval.mode": args.mode,
            "service.rate_limit_per_s": 1_000_000,
            "service.rate_limit_burst": 1_000_000,
            "service.max_pending_sessions": 1_000_000,
            "consolidation.every_n_sessions": 0,
        }
    )
    setups: dict[str, dict] = {}

    # The baseline: one SQLite serve on a copy of the pre-filled file (its index files rebuilt, as a replica's).
    seed = folder / "seed.db"
    prefill_sqlite_s = prefill(str(seed), {"embedder.backend": "hashing"}, turns, args.memories)
    sqlite_dir = folder / "sqlite"
    sqlite_dir.mkdir()
    db = sqlite_dir / "service.db"
    shutil.copy(seed, db)
    setups["sqlite"] = load_setup(
        "sqlite", [ServeProcess(db, common, sqlite_dir / "serve.log", ["--no-worker"])], None, args, turns, questions
    )

    template = f"{DB_PREFIX}_seed"
    seed_url = databases.create(template)
    seed_overrides = {"embedder.backend": "hashing", "store.url": seed_url, "store.local_dir": str(folder / "seed")}
    prefill_pg_s = prefill(seed_url, seed_overrides, turns, args.memories)
    for count in args.replicas:
        name = f"pg x{count}"
        url = databases.create(f"{DB_PREFIX}_r{count}", template=template)
        here = folder / f"pg{count}"
        here.mkdir()
        servers = [
            ServeProcess(
                here / "unused.db",  # --db is required; store.url wins
                {**common, "store.url": url, "store.local_dir": str(here / f"r{n}")},
                here / f"r{n}.log",
                ["--no-worker"],
            )
            for n in range(1, count + 1)
        ]
        setups[name] = load_setup(name, servers, databases.pid, args, turns, questions)

    base = setups["sqlite"]
    pg_one = setups[f"pg x{args.replicas[0]}"]
    for name, setup in setups.items():
        setup["rps_over_sqlite"] = setup["throughput_rps"] / base["throughput_rps"]
        setup["search_p95_over_sqlite"] = setup["search"]["p95_ms"] / base["search"]["p95_ms"]
        if name != "sqlite":
            setup["rps_over_first_postgres"] = setup["throughput_rps"] / pg_one["throughput_rps"]
    return {
        "memories": args.memories,
        "mode": args.mode,
        "threads": args.threads,
        "replicas": args.replicas,
        "duration_s": args.duration,
        "search_share": args.search_share,
        "prefill_s": {"sqlite": prefill_sqlite_s, "postgres": prefill_pg_s},
        "setups": setups,
    }


# --------------------------------------------------------------------------- curation throughput


def curation_sessions(turns, namespace: str, count: int, tag: str):
    from hybridmem_local.schema import Session, Turn

    rng = random.Random(tag)
    started = datetime(2023, 5, 8, tzinfo=timezone.utc)
    sessions = []
    for n in range(count):
        sid = f"{tag}{n}"
        chosen = rng.sample(turns, TURNS)
        sessions.append(
            Session(
                session_id=sid,
                namespace=namespace,
                started_at=started + timedelta(minutes=n),
                turns=[Turn(turn_id=f"{sid}:{i}", speaker=s, text=t) for i, (s, t) in enumerate(chosen)],
            )
        )
    return sessions


def queue_counts(url: str, namespace: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(pg_conninfo(url)) as conn:
        rows = conn.execute(
            "SELECT curation_status, count(*) FROM sessions WHERE namespace = %s GROUP BY 1", (namespace,)
        ).fetchall()
        memories = conn.execute("SELECT count(*) FROM memories WHERE namespace = %s", (namespace,)).fetchone()[0]
        # A session curated twice holds the same memory twice; one lost holds none. (Fewer than
        # MEMORIES_PER_SESSION is the curator's own filter: a reply's memory it drops, on any store.)
        per_session = conn.execute(
            "SELECT count(m.id), count(DISTINCT m.kind || coalesce(m.title, '') || coalesce(m.entity, '') || "
            "coalesce(m.object, '') || m.source_turn_ids) FROM sessions s LEFT JOIN memories m "
            "ON m.namespace = s.namespace AND m.source_session_id = s.session_id WHERE s.namespace = %s "
            "GROUP BY s.id",
            (namespace,),
        ).fetchall()
    counts = {status: n for status, n in rows}
    counts["memories"] = memories
    counts["sessions_curated_twice"] = sum(1 for n, distinct in per_session if n != distinct)
    counts["sessions_without_memories"] = sum(1 for n, _ in per_session if n == 0)
    return counts


def wait_curated(url: str, namespace: str, total: int, timeout_s: float) -> tuple[float, dict]:
    """Poll every 50 ms until no session of ``namespace`` is pending; (seconds, counts)."""
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(pg_conninfo(url), autocommit=True) as conn:
        while time.perf_counter() - started < timeout_s:
            done = conn.execute(
                "SELECT count(*) FROM sessions WHERE namespace = %s AND curation_status <> 'pending'", (namespace,)
            ).fetchone()[0]
            if done >= total:
                break
            time.sleep(0.05)
    return time.perf_counter() - started, queue_counts(url, namespace)


BATCH_LINE = re.compile(rb"batch of (\d+) session\(s\) from \d+ namespace\(s\): (\d+) curated, (\d+) failed")


def curated_by(log: Path) -> int:
    """Sessions a worker's log says it curated (service/worker.py's batch line), warm-up included."""
    return sum(int(m.group(2)) for m in BATCH_LINE.finditer(log.read_bytes()))


def curation_run(workers: int, args, databases: Databases, folder: Path, llm: ChatServer, turns) -> dict:
    from hybridmem_local.config import load_config
    from hybridmem_local.memory import HybridMemory

    url = databases.create(f"{DB_PREFIX}_w{workers}")
    here = folder / f"workers{workers}"
    here.mkdir()
    overrides = llm.overrides(
        **{
            "store.url": url,
            "embedder.backend": "hashing",
            "retrieval.mode": args.mode,
            "consolidation.every_n_sessions": 0,
            "llm.max_retries": 0,
            "curation.retry_rounds": 0,
            "curation.batch_sessions": args.batch_sessions,
            "service.worker_poll_s": 0.1,
            "service.claim_lease_s": 60,
        }
    )
    processes = [
        WorkerProcess(here / "unused.db", {**overrides, "store.local_dir": str(here / f"w{n}")}, here / f"w{n}.log")
        for n in range(1, workers + 1)
    ]
    try:
        ready_s = start_all(processes)
        client_overrides = {**overrides, "store.local_dir": str(here / "client")}
        with HybridMemory.open(url, load_config(None, client_overrides)) as memory:
            # Warm-up (first LLM call, first index of the namespace), one session per worker, untimed.
            warm = curation_sessions(turns, "warmup", workers, "warm")
            memory.enqueue(warm)
            wait_curated(url, "warmup", len(warm), 120)
            sessions = curation_sessions(turns, CURATION_NAMESPACE, args.curation_sessions, "c")
            timeout = 120 + 4 * args.curation_sessions * args.llm_delay / args.batch_sessions
            console.print(
                f"[bold]curation[/]: {workers} worker(s) ready in {ready_s:.1f}s; "
                f"{len(sessions)} sessions, LLM {args.llm_delay}s a request"
            )
            memory.enqueue(sessions)  # one transaction: the clock starts at its commit
            seconds, counts = wait_curated(url, CURATION_NAMESPACE, len(sessions), timeout)
    finally:
        codes = stop_processes(processes)
    per_worker = [curated_by(p.log_path) for p in processes]
    return {
        "workers": workers,
        "sessions": len(sessions),
        "seconds": seconds,
        "sessions_per_s": counts.get("curated", 0) / seconds,
        "curated": counts.get("curated", 0),
        "failed": counts.get("curation_failed", 0),
        "pending_at_end": counts.get("pending", 0),
        "memories": counts["memories"],
        "memories_at_most": len(sessions) * MEMORIES_PER_SESSION,
        "sessions_curated_twice": counts["sessions_curated_twice"],
        "sessions_without_memories": counts["sessions_without_memories"],
        "curated_per_worker_incl_warmup": per_worker,
        "ready_s": ready_s,
        "exit_codes": codes,
    }


def bench_curation(args, databases: Databases, folder: Path, turns) -> dict:
    llm = ChatServer(lambda body, attempt: Sleep(args.llm_delay, curation_reply(body)))
    try:
        runs = {str(w): curation_run(w, args, databases, folder, llm, turns) for w in args.workers}
    finally:
        llm.stop()
    first = runs[str(args.workers[0])]
    for run in runs.values():
        run["over_first"] = run["sessions_per_s"] / first["sessions_per_s"]
    return {
        "llm_delay_s": args.llm_delay,
        "batch_sessions": args.batch_sessions,
        "turns_per_session": TURNS,
        # One worker's ceiling at this LLM latency: a batch's requests go to the LLM concurrently.
        "llm_bound_sessions_per_s_per_worker": args.batch_sessions / args.llm_delay,
        "runs": runs,
    }


# --------------------------------------------------------------------------- main


def versions() -> dict:
    out = {}
    for name in ("sqlalchemy", "psycopg", "psycopg-binary", "alembic", "httpx", "uvicorn", "fastapi", "hnswlib"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run (< 2 min): short load, small store")
    parser.add_argument("--duration", type=float, default=None, help="seconds of load per set-up (45; quick 6)")
    parser.add_argument("--threads", type=int, default=8, help="client threads, round-robin over the replicas")
    parser.add_argument("--memories", type=int, default=None, help="memories pre-filled (10,000; quick 1,000)")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4], help="PostgreSQL replica counts")
    parser.add_argument("--search-share", type=float, default=0.8, help="share of searches; the rest are writes")
    parser.add_argument("--mode", choices=["hybrid", "dense", "lexical"], default="hybrid", help="retrieval.mode")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="hybridmem worker counts")
    parser.add_argument("--curation-sessions", type=int, default=None, help="sessions curated per run (160; quick 32)")
    parser.add_argument("--llm-delay", type=float, default=0.5, help="seconds the fake LLM takes per request")
    parser.add_argument("--batch-sessions", type=int, default=4, help="curation.batch_sessions of each worker")
    parser.add_argument("--postgres-url", default=None, help="a running server (default: a throwaway one)")
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--no-load", action="store_true")
    parser.add_argument("--no-curation", action="store_true")
    parser.add_argument("--keep-run", action="store_true", help="keep the run folder (stores, logs)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.duration = args.duration or (6.0 if args.quick else 45.0)
    args.memories = args.memories or (1_000 if args.quick else 10_000)
    args.curation_sessions = args.curation_sessions or (32 if args.quick else 160)

    # A SIGTERM runs the finally blocks too: every process and the throwaway server stopped by PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    info = machine()
    info["cpus_allowed"] = len(os.sched_getaffinity(0))
    info["versions"] = versions()
    source, turns, questions = texts(args.locomo)
    results: dict = {"machine": info, "texts": source}
    folder = WORK / f"run-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with ExitStack() as stack:
            databases = stack.enter_context(postgres_server(args.postgres_url))
            info["postgres_server"] = databases.server_version()
            info["postgres"] = "throwaway (tests/postgres_cluster.py)" if args.postgres_url is None else "given URL"
            if not args.no_load:
                llm = ChatServer(lambda body, attempt: curation_reply(body))
                stack.callback(llm.stop)
                results["load"] = bench_load(args, databases, folder, llm, turns, questions)
            if not args.no_curation:
                results["curation"] = bench_curation(args, databases, folder, turns)
    finally:
        if not args.keep_run:
            shutil.rmtree(folder, ignore_errors=True)
    info["load_average_at_end"] = os.getloadavg()
    info["total_s"] = time.perf_counter() - started
    results["note"] = note(info)
    print_tables(results)
    write_json(args.out, results)


def note(info: dict) -> str:
    return (
        f"{info['cpus']} cores on this machine, {info['cpus_allowed']} allowed to this run, shared by the clients, "
        "every replica or worker and PostgreSQL: more replicas cannot add CPU here, so the replica ratios show the "
        "cost of sharing one database, not scale-out; on separate hosts each replica brings its own cores."
    )


def print_tables(results: dict) -> None:
    info = results["machine"]
    console.print(
        f"{info['cpu']} · {info['cpus']} cores ({info['cpus_allowed']} allowed) · PostgreSQL "
        f"{info.get('postgres_server')} · sqlalchemy {info['versions']['sqlalchemy']} · psycopg "
        f"{info['versions']['psycopg']}"
    )
    if "load" in results:
        load = results["load"]
        table = Table(
            title=f"replicas on one store · {load['memories']:,} memories · {load['search_share']:.0%} search, "
            f"the rest add memories / add session · {load['threads']} clients round-robin · {load['duration_s']:.0f}s "
            f"each · retrieval {load['mode']} · hashing embedder · no worker"
        )
        for column in (
            "set-up",
            "req/s",
            "× sqlite",
            f"× pg x{load['replicas'][0]}",
            "search p50",
            "p95",
            "p95 × sqlite",
            "p99",
            "write p95",
            "errors",
            "1st search s (max)",
            "CPU s replicas",
            "CPU s pg",
            "CPU ms/req",
            "RSS MB (max)",
        ):
            table.add_column(column, justify="right")
        for name, s in load["setups"].items():
            table.add_row(
                name,
                f"{s['throughput_rps']:.1f}",
                f"{s['rps_over_sqlite']:.2f}×",
                f"{s['rps_over_first_postgres']:.2f}×" if "rps_over_first_postgres" in s else "-",
                f"{s['search']['p50_ms']:.1f}",
                f"{s['search']['p95_ms']:.1f}",
                f"{s['search_p95_over_sqlite']:.2f}×",
                f"{s['search']['p99_ms']:.1f}",
                f"{s['writes']['p95_ms']:.1f}" if s["writes"] else "-",
                str(s["errors"]),
                f"{max(s['first_search_s']):.1f}",
                f"{s['cpu_s']['replicas']:.1f}",
                f"{s['cpu_s']['postgres']:.1f}" if s["cpu_s"]["postgres"] is not None else "-",
                f"{s['server_cpu_ms_per_request']:.1f}",
                f"{max(s['rss_mb']):.0f}",
            )
        console.print(table)
    if "curation" in results:
        curation = results["curation"]
        table = Table(
            title=f"curation by hybridmem worker processes on PostgreSQL · fake LLM {curation['llm_delay_s']}s a "
            f"request · batch_sessions {curation['batch_sessions']} · {curation['turns_per_session']} turns a session"
        )
        for column in (
            "workers",
            "sessions",
            "seconds",
            "sessions/s",
            "× 1 worker",
            "curated",
            "failed",
            "memories (≤)",
            "twice / none",
            "per worker",
        ):
            table.add_column(column, justify="right")
        for run in curation["runs"].values():
            table.add_row(
                str(run["workers"]),
                str(run["sessions"]),
                f"{run['seconds']:.1f}",
                f"{run['sessions_per_s']:.2f}",
                f"{run['over_first']:.2f}×",
                str(run["curated"]),
                str(run["failed"]),
                f"{run['memories']} ({run['memories_at_most']})",
                f"{run['sessions_curated_twice']} / {run['sessions_without_memories']}",
                "/".join(map(str, run["curated_per_worker_incl_warmup"])),
            )
        console.print(table)
        console.print(
            f"one worker's LLM-bound ceiling: {curation['llm_bound_sessions_per_s_per_worker']:.1f} sessions/s"
        )
    console.print(f"[dim]{results['note']}[/]")


if __name__ == "__main__":
    main()
