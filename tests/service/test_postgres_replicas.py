"""Several processes on one PostgreSQL store, started for real: ``hybridmem serve --no-worker``
replicas and ``hybridmem worker`` processes sharing one database of the suite's throwaway
cluster (tests/postgres_cluster.py), and the database failing under a running service.

* Two replicas and two workers: clients write through both replicas, a worker is SIGKILLed while
  its batch is inside the (slow) LLM; every accepted session ends curated exactly once, and a
  search on either replica finds what the workers wrote, at its first search after the commit.
* ``forget`` through one replica: the other finds nothing and keeps no index file of it.
* The database restarted (or killed) under ``hybridmem serve``: 503 ``store_unavailable`` while it
  is away, 200 again by itself once it is back, nothing lost.
* Connections dropped mid-transaction (a request's write, a worker's curation) and between
  requests: each write happened whole or not at all, and the service goes on.

Each process keeps its local files (index files, LLM cache) in a folder of its own
(``store.local_dir``), as replicas on different hosts would. The LLM is the fake ``vllm serve``
of the service tests (tests/fake_vllm_server.py); the embedder is the hashing one: these tests
are about the store and the queue, not the models. "Mid-transaction" is made certain, not
hoped for: the test holds the row lock of ``store_changes``, which every write transaction
updates last (``PostgresBackend.before_commit``), so a write waits there with all its rows
written; pg_locks shows which tables it has written.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pytest

from hybridmem_local.schema import Session
from tests.fake_vllm_server import ChatServer, Sleep, curation_reply, session_key
from tests.faults.corpus import curated_sessions
from tests.service.live import LiveProcess, ServeProcess, WorkerProcess
from tests.service.test_faults import MEMORIES_PER_SESSION, OVERRIDES, TURNS, session_body, wait_until

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.postgres  # each test is marked slow too: it starts processes

#: How long the fake LLM takes per request: a SIGKILL lands inside a batch.
LLM_S = 2.0
#: A claim's lease: a killed worker's sessions are anyone's again after this (renewed every third).
LEASE_S = 3.0
#: What a request may take while the database is away (a clear 503, not a hang).
OUTAGE_ANSWER_S = 5.0

NAMESPACES = ("alice", "bob", "carol")
PER_NAMESPACE = 4


def base_overrides(llm: ChatServer, url: str, local_dir: Path, **extra) -> dict:
    """The PostgreSQL store at ``url`` with this process's local files in ``local_dir``, the fake
    LLM, the hashing embedder, a short lease and no rate limit in the way of polling."""
    return llm.overrides(
        **OVERRIDES,
        **{
            "store.url": url,
            "store.local_dir": str(local_dir),
            "embedder.backend": "hashing",
            "service.claim_lease_s": LEASE_S,
            "service.rate_limit_per_s": 1000.0,
            "service.rate_limit_burst": 1000,
            **extra,
        },
    )


def word_for(session_id: str) -> str:
    """A word found in one session's turns, hence in every memory curated from it, and nowhere else."""
    return f"zyxqu{session_id}"


def worded_sessions(namespaces=NAMESPACES, each: int = PER_NAMESPACE, seed: int = 17) -> list[Session]:
    """``each`` sessions per namespace with ids unique across namespaces (s1.., so an LLM request's
    turn ids name its session), every turn starting with its session's word (so the tuple curated
    from each turn holds it too)."""
    out = []
    for n, namespace in enumerate(namespaces):
        for curated in curated_sessions(namespace, each, seed=seed, first=1 + n * each, turns=TURNS):
            session = curated.session
            word = word_for(session.session_id)
            turns = [t.model_copy(update={"text": f"{word} {t.text}"}) for t in session.turns]
            out.append(session.model_copy(update={"turns": turns}))
    return out


# --------------------------------------------------------------------------- the database, read apart


def pg_connect(url: str, autocommit: bool = True):
    """A psycopg connection of the test's own to the store's database."""
    return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1), autocommit=autocommit)


def database_name(url: str) -> str:
    return url.rsplit("/", 1)[1]


def stored(url: str) -> dict[tuple[str, str], dict[str, object]]:
    """(namespace, session id) → what the database holds of it: status, turns, memories, distinct
    memories, memory 'add' events and 'add_session' events."""
    with pg_connect(url) as conn:
        rows = conn.execute(
            """
            SELECT s.namespace, s.session_id, s.curation_status,
                (SELECT count(*) FROM turns t WHERE t.session_pk = s.id),
                (SELECT count(*) FROM memories m
                    WHERE m.namespace = s.namespace AND m.source_session_id = s.session_id),
                (SELECT count(DISTINCT m.kind || coalesce(m.title, '') || coalesce(m.entity, '') ||
                        coalesce(m.object, '') || m.source_turn_ids)
                    FROM memories m WHERE m.namespace = s.namespace AND m.source_session_id = s.session_id),
                (SELECT count(*) FROM events e JOIN memories m ON m.id = e.memory_id
                    WHERE m.namespace = s.namespace AND m.source_session_id = s.session_id AND e.action = 'add'),
                (SELECT count(*) FROM events e WHERE e.namespace = s.namespace AND e.action = 'add_session'
                    AND e.after LIKE '%"' || s.session_id || '"%')
            FROM sessions s
            """
        ).fetchall()
    return {
        (ns, sid): {
            "status": status,
            "turns": turns,
            "memories": mem,
            "distinct": distinct,
            "adds": adds,
            "logged": logged,
        }
        for ns, sid, status, turns, mem, distinct, adds, logged in rows
    }


def assert_accepted_are_whole(url: str, accepted: set[tuple[str, str]]) -> dict[str, int]:
    """Every accepted session is stored whole and once, pending without memories or curated with
    exactly its own, each memory written once; returns how many are in each status."""
    rows = stored(url)
    assert set(rows) == accepted, f"lost: {accepted - set(rows)}, unexpected: {set(rows) - accepted}"
    counts = {"pending": 0, "curated": 0}
    for key, row in rows.items():
        assert row["turns"] == TURNS, f"{key}: {row}"
        assert row["logged"] == 1, f"{key}: stored {row['logged']} times: {row}"
        assert (row["status"], row["memories"]) in (("pending", 0), ("curated", MEMORIES_PER_SESSION)), f"{key}: {row}"
        assert row["distinct"] == row["memories"] == row["adds"], f"{key}: a memory is stored twice: {row}"
        counts[str(row["status"])] += 1
    return counts


def claims(url: str) -> dict[str, tuple[str, str | None]]:
    """session id → (status, claimed_by) for every session."""
    with pg_connect(url) as conn:
        return {
            sid: (status, by)
            for sid, status, by in conn.execute("SELECT session_id, curation_status, claimed_by FROM sessions")
        }


def claimed_by_pid(claimed_by: str | None) -> int | None:
    """The PID in a worker's name (``host:pid:random``, service/worker.py)."""
    return int(claimed_by.rsplit(":", 2)[1]) if claimed_by else None


@contextmanager
def store_changes_held(url: str) -> Iterator[None]:
    """Hold the row lock of ``store_changes``: every write transaction of the store updates that row
    last, before its COMMIT, so a write started meanwhile waits there with all its rows written."""
    conn = pg_connect(url, autocommit=False)
    try:
        conn.execute("SELECT version FROM store_changes FOR UPDATE")
        yield
    finally:
        with suppress(psycopg.OperationalError):  # terminated with the others
            conn.rollback()
        conn.close()


def waiting_writers(url: str) -> list[tuple[int, set[str]]]:
    """(pid, tables it has written in its open transaction) of each backend of the store's database
    waiting for a lock (asked on that database: pg_class is per database)."""
    with pg_connect(url) as conn:
        rows = conn.execute(
            "SELECT a.pid, c.relname FROM pg_stat_activity a "
            "LEFT JOIN pg_locks l ON l.pid = a.pid AND l.mode = 'RowExclusiveLock' AND l.granted "
            "LEFT JOIN pg_class c ON c.oid = l.relation "
            "WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'"
        ).fetchall()
    waiting: dict[int, set[str]] = {}
    for pid, table in rows:
        waiting.setdefault(pid, set()).update([table] if table else [])
    return list(waiting.items())


def wait_for_writer(url: str, table: str, timeout_s: float = 20) -> None:
    """Until a backend waits for a lock with rows of ``table`` written (and not committed)."""
    wait_until(
        lambda: any(table in written for _, written in waiting_writers(url)),
        timeout_s,
        f"a transaction that wrote {table} to wait for the store_changes lock",
    )


# --------------------------------------------------------------------------- requests


def error_code(response: httpx.Response) -> str | None:
    try:
        return response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def hits_with(result: dict, word: str) -> list[dict]:
    """The memories of a search result (episodes and tuples) whose text holds ``word``."""
    return [
        h["memory"] for h in result.get("episodes", []) + result.get("tuples", []) if word in json.dumps(h["memory"])
    ]


def search(base_url: str, namespace: str, word: str) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/namespaces/{namespace}/search", json={"query": word, "k": 3}, timeout=30)


def stop_all(processes: list[LiveProcess]) -> None:
    for process in processes:
        if process.process.poll() is None:
            process.kill()


@contextmanager
def cluster_back_up(cluster) -> Iterator[None]:
    """Whatever the test does to the shared cluster, it runs again afterwards (the next tests need it)."""
    try:
        yield
    finally:
        if cluster.pid is None:
            cluster.start_again()


# --------------------------------------------------------------------------- replicas and workers


@pytest.mark.slow
def test_two_replicas_and_two_workers_curate_each_session_once_and_search_each_others_writes(postgres_url, tmp_path):
    started = time.monotonic()
    arrivals: dict[str, float] = {}  # session id → when its curation request reached the LLM

    def respond(body: dict, attempt: int):
        arrivals[session_key(body)] = time.monotonic()
        return Sleep(LLM_S, curation_reply(body))

    llm = ChatServer(respond)
    db = tmp_path / "unused.db"  # --db is required; store.url wins
    replicas = [
        ServeProcess(db, base_overrides(llm, postgres_url, tmp_path / f"r{n}"), tmp_path / f"r{n}.log", ["--no-worker"])
        for n in (1, 2)
    ]
    workers = [
        WorkerProcess(db, base_overrides(llm, postgres_url, tmp_path / f"w{n}"), tmp_path / f"w{n}.log") for n in (1, 2)
    ]
    processes: list[LiveProcess] = [*replicas, *workers]
    sessions = worded_sessions()
    accepted: set[tuple[str, str]] = set()
    timings: dict[str, float] = {}
    try:
        for process in processes:
            process.wait_ready()
        timings["started"] = time.monotonic() - started
        assert not db.exists(), "a PostgreSQL store must not create the SQLite file"

        # 1. Clients write through both replicas in turn; each session is readable on the other at once.
        for n, session in enumerate(sessions):
            writer, reader = replicas[n % 2], replicas[(n + 1) % 2]
            response = httpx.post(
                f"{writer.base_url}/v1/namespaces/{session.namespace}/sessions", json=session_body(session), timeout=30
            )
            assert response.status_code == 202, response.text
            accepted.add((session.namespace, session.session_id))
            seen = httpx.get(f"{reader.base_url}/v1/namespaces/{session.namespace}/sessions/{session.session_id}")
            assert seen.status_code == 200, f"written on {writer.base_url}, not seen on {reader.base_url}: {seen.text}"
            assert [t["text"] for t in seen.json()["session"]["turns"]] == [t.text for t in session.turns]

        # 2. SIGKILL a worker whose batch is inside the LLM (its request arrived under LLM_S ago).
        by_pid = {w.pid: w for w in workers}
        victim: list[tuple[WorkerProcess, set[str]]] = []

        def batch_in_llm() -> bool:
            now = time.monotonic()
            in_llm = {sid for sid, at in list(arrivals.items()) if now - at < LLM_S - 0.5}
            held: dict[int, set[str]] = {}
            for sid, (status, by) in claims(postgres_url).items():
                pid = claimed_by_pid(by)
                if status == "pending" and sid in in_llm and pid in by_pid:
                    held.setdefault(pid, set()).add(sid)
            if held:
                pid, sids = next(iter(held.items()))
                victim.append((by_pid[pid], sids))
            return bool(held)

        wait_until(batch_in_llm, 30, "a worker's batch to reach the LLM")
        killed, killed_sessions = victim[0]
        killed.kill()
        killed_at = time.monotonic()
        after_kill = claims(postgres_url)
        assert all(after_kill[sid][0] == "pending" for sid in killed_sessions), (
            f"the kill did not land inside the batch of {sorted(killed_sessions)}: {after_kill}"
        )
        assert_accepted_are_whole(postgres_url, accepted)
        survivor = next(w for w in workers if w is not killed)

        # 3. Every session gets curated (the killed batch by the survivor, once its lease ran out);
        #    each replica is searched at once for every session newly seen curated in the database.
        first_try_misses: list[str] = []
        searched: set[str] = set()
        killed_done_at: list[float] = []

        def all_curated() -> bool:
            counts = assert_accepted_are_whole(postgres_url, accepted)
            rows = stored(postgres_url)
            for (namespace, sid), row in rows.items():
                if row["status"] != "curated" or sid in searched:
                    continue
                searched.add(sid)
                for replica in replicas:
                    response = search(replica.base_url, namespace, word_for(sid))
                    assert response.status_code == 200, response.text
                    if not hits_with(response.json(), word_for(sid)):
                        first_try_misses.append(f"{sid} on {replica.base_url}")
            if not killed_done_at and all(
                rows[(ns, sid)]["status"] == "curated" for ns, sid in rows if sid in killed_sessions
            ):
                killed_done_at.append(time.monotonic())
            return counts["pending"] == 0

        wait_until(all_curated, 60, "every session to be curated")
        timings["curated"] = time.monotonic() - started
        timings["killed_batch_redone_after_s"] = killed_done_at[0] - killed_at
        # Its claim, renewed every third of the lease, holds at least two thirds of it after the kill.
        assert killed_done_at[0] - killed_at >= LEASE_S * 2 / 3 + LLM_S - 1, "the killed worker's claim ended early"
        assert survivor.process.poll() is None, survivor.log_path.read_text()[-3000:]

        # 4. A search on either replica finds every session's memories, written by the workers.
        assert first_try_misses == [], (
            f"a replica's first search after the curation committed missed it: {first_try_misses}"
        )
        for namespace, sid in sorted(accepted):
            for replica in replicas:
                found = hits_with(search(replica.base_url, namespace, word_for(sid)).json(), word_for(sid))
                assert found, f"{namespace}/{sid} not found on {replica.base_url}"
                assert {m["source_session_id"] for m in found} == {sid}

        # 5. The others stop cleanly (uvicorn re-raises SIGTERM after a graceful shutdown: -SIGTERM
        #    is a clean end too; a worker exits 0), and the store is as it was: nothing lost.
        codes = {p.log_path.name: p.terminate() for p in processes if p is not killed}
        assert all(code in (0, -signal.SIGTERM) for code in codes.values()), codes
    finally:
        llm.stop()
        stop_all(processes)
    assert assert_accepted_are_whole(postgres_url, accepted) == {"pending": 0, "curated": len(sessions)}
    timings["total"] = time.monotonic() - started
    print(f"timings: {timings}")


@pytest.mark.slow
def test_forget_on_one_replica_leaves_nothing_on_the_other(postgres_url, tmp_path):
    llm = ChatServer(lambda body, attempt: curation_reply(body))
    db = tmp_path / "unused.db"
    replicas = [
        ServeProcess(db, base_overrides(llm, postgres_url, tmp_path / f"r{n}"), tmp_path / f"r{n}.log", ["--no-worker"])
        for n in (1, 2)
    ]
    one, two = replicas
    try:
        for replica in replicas:
            replica.wait_ready()
        for namespace, session in zip(("gone", "kept"), worded_sessions(("gone", "kept"), each=1), strict=True):
            response = httpx.post(f"{one.base_url}/v1/namespaces/{namespace}/sessions", json=session_body(session))
            assert response.status_code == 202, response.text
            word = word_for(session.session_id)
            response = httpx.post(
                f"{one.base_url}/v1/namespaces/{namespace}/memories",
                json={
                    "episodes": [
                        {
                            "title": f"Talk about {word}",
                            "summary": f"{word} was mentioned",
                            "details": session.turns[0].text,
                            "timestamp": "2023-05-08",
                            "source_turn_ids": [session.turns[0].turn_id],
                        }
                    ],
                    "tuples": [
                        {
                            "entity": session.turns[0].speaker,
                            "relation": "mentioned",
                            "object": word,
                            "timestamp": "2023-05-08",
                            "source_turn_ids": [session.turns[0].turn_id],
                        }
                    ],
                },
            )
            assert response.status_code == 201, response.text
            # Replica two builds (and saves) its own index files of the namespace.
            assert hits_with(search(two.base_url, namespace, word).json(), word), f"{namespace} not found on two"
        gone_word, kept_word = word_for("s1"), word_for("s2")
        two_gone = tmp_path / "r2" / "store.indexes" / "gone"
        assert two_gone.is_dir() and any(p.is_file() for p in two_gone.rglob("*")), "replica two wrote no index files"

        response = httpx.request("DELETE", f"{one.base_url}/v1/namespaces/gone", timeout=30)
        assert response.status_code == 200, response.text
        assert not (tmp_path / "r1" / "store.indexes" / "gone").exists()

        def left_on_two() -> list[str]:
            files = two_gone.rglob("*") if two_gone.exists() else []
            return sorted(str(p.relative_to(tmp_path)) for p in files if p.is_file())

        # Replica two's next request, about another namespace: no index file of the forgotten one
        # is left on its disk after it (a replica need not be asked about a namespace to drop it).
        assert hits_with(search(two.base_url, "kept", kept_word).json(), kept_word)
        assert left_on_two() == [], "replica two still holds index files of the forgotten namespace"
        # Nothing of the namespace through replica two, by search, list or get (empty, or a 404),
        # and its search brings no file back.
        result = search(two.base_url, "gone", gone_word)
        assert result.status_code in (200, 404), result.text
        assert result.status_code == 404 or not result.json()["episodes"] + result.json()["tuples"], result.text
        listed = httpx.get(f"{two.base_url}/v1/namespaces/gone/memories")
        assert listed.status_code == 404 or listed.json()["items"] == [], listed.text
        assert httpx.get(f"{two.base_url}/v1/namespaces/gone/sessions/s1").status_code == 404
        # Asked about it, replica two may build the (empty) indexes of a namespace it does not
        # have; none of them holds a word of what was forgotten.
        for name in left_on_two():
            assert gone_word.encode() not in (tmp_path / name).read_bytes(), name
        # The other namespace is untouched on both.
        for replica in replicas:
            assert hits_with(search(replica.base_url, "kept", kept_word).json(), kept_word)
    finally:
        llm.stop()
        stop_all(replicas)


# --------------------------------------------------------------------------- faults


class Answers:
    """Every answer of a fault test as (phase, request, status, error code, seconds), checked at the
    end so a failure shows the whole sequence (a 500 poisoning later requests, say)."""

    def __init__(self, client: httpx.Client):
        self.client = client
        self.rows: list[tuple[str, str, int, str | None, float]] = []

    def send(self, phase: str, what: str, method: str, path: str, **kwargs) -> httpx.Response:
        start = time.monotonic()
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.TransportError as exc:  # the server dropped the connection: an unhandled error
            self.rows.append((phase, what, 0, type(exc).__name__, time.monotonic() - start))
            raise AssertionError(f"{phase}: {what}: {exc!r}\n{self}") from exc
        self.rows.append((phase, what, response.status_code, error_code(response), time.monotonic() - start))
        return response

    def of(self, phase: str) -> list[tuple[str, str, int, str | None, float]]:
        return [row for row in self.rows if row[0] == phase]

    def __str__(self) -> str:
        return "\n".join(
            f"  {phase:<24} {what:<16} {status} {code or ''} {s:.2f}s" for phase, what, status, code, s in self.rows
        )


#: A read of each kind, the search first: it reads the store's change marker before anything else.
READS = {
    "search": ("POST", "/search"),
    "get session": ("GET", "/sessions/s1"),
    "list memories": ("GET", "/memories"),
    "stats": ("GET", "/stats"),
}


def each_request(answers: Answers, phase: str, namespace: str, post: Session | None) -> None:
    """Every read of READS (searching s1's word), then POST ``post`` (when given), then /readyz."""
    for what, (method, path) in READS.items():
        body = {"json": {"query": word_for("s1")}} if what == "search" else {}
        answers.send(phase, what, method, f"/v1/namespaces/{namespace}{path}", **body)
    if post is not None:
        answers.send(phase, "post session", "POST", f"/v1/namespaces/{namespace}/sessions", json=session_body(post))
    answers.send(phase, "readyz", "GET", "/readyz")


@pytest.mark.slow
def test_database_restarted_under_serve_answers_503_then_recovers_by_itself(postgres_cluster, postgres_url, tmp_path):
    llm = ChatServer(lambda body, attempt: curation_reply(body))
    server = ServeProcess(
        tmp_path / "unused.db", base_overrides(llm, postgres_url, tmp_path / "r1"), tmp_path / "serve.log"
    )
    before, during, after, later = worded_sessions(("alice",), each=4)
    accepted = {("alice", before.session_id)}
    client = httpx.Client(base_url=server.base_url, timeout=30)
    answers = Answers(client)
    try:
        with cluster_back_up(postgres_cluster):
            server.wait_ready()
            answers.send("before", "post session", "POST", "/v1/namespaces/alice/sessions", json=session_body(before))
            wait_until(lambda: assert_accepted_are_whole(postgres_url, accepted)["pending"] == 0, 30, "curation")
            each_request(answers, "before", "alice", None)

            # 1. The database crashes (SIGKILL): every request answers 503 store_unavailable at once.
            postgres_cluster.kill()
            for attempt in (1, 2):
                each_request(answers, f"database down, try {attempt}", "alice", during)
            # 2. It comes back (crash recovery): the same server answers at once, by itself.
            postgres_cluster.start_again()
            each_request(answers, "database back", "alice", after)
            accepted.add(("alice", after.session_id))
            # 3. A clean restart between two requests: one 503 per connection at most while the
            #    server finds its connections gone, then 200 again by itself.
            postgres_cluster.restart()
            for attempt in (1, 2):
                each_request(answers, f"restarted, try {attempt}", "alice", later if attempt == 2 else None)
            accepted.add(("alice", later.session_id))

        assert all(status in (200, 202) for _, _, status, _, _ in answers.of("before")), f"before:\n{answers}"
        down = answers.of("database down, try 1") + answers.of("database down, try 2")
        assert all((status, code) == (503, "store_unavailable") for _, _, status, code, _ in down), (
            f"while the database is down every request must answer 503 store_unavailable:\n{answers}"
        )
        assert max(s for *_, s in down) < OUTAGE_ANSWER_S, f"a request hung while the database was down:\n{answers}"
        assert all(status in (200, 202) for _, _, status, _, _ in answers.of("database back")), (
            f"the first requests once the database is back must succeed:\n{answers}"
        )
        first = answers.of("restarted, try 1")
        assert all(status == 200 or (status, code) == (503, "store_unavailable") for _, _, status, code, _ in first), (
            f"after a restart:\n{answers}"
        )
        assert all(status in (200, 202) for _, _, status, _, _ in answers.of("restarted, try 2")), (
            f"the second requests after a restart must succeed:\n{answers}"
        )
        print(f"answers:\n{answers}")

        # 4. Nothing lost, nothing half-stored: the session posted while the database was down is
        #    not there; the others are whole, and the worker curates them.
        wait_until(lambda: assert_accepted_are_whole(postgres_url, accepted)["pending"] == 0, 30, "curation", server)
        for session in (before, after, later):
            word = word_for(session.session_id)
            found = client.post("/v1/namespaces/alice/search", json={"query": word})
            assert hits_with(found.json(), word), f"{session.session_id}: {found.text[:300]}"
    finally:
        client.close()
        llm.stop()
        stop_all([server])


@pytest.mark.slow
def test_connection_dropped_under_a_request_write_or_between_requests(postgres_cluster, postgres_url, tmp_path):
    llm = ChatServer(lambda body, attempt: curation_reply(body))
    server = ServeProcess(
        tmp_path / "unused.db",
        base_overrides(llm, postgres_url, tmp_path / "r1"),
        tmp_path / "serve.log",
        ["--no-worker"],
    )
    first, second, third, fourth = worded_sessions(("alice",), each=4)
    client = httpx.Client(base_url=server.base_url, timeout=30)
    answers = Answers(client)
    url = "/v1/namespaces/alice"
    database = database_name(postgres_url)
    try:
        server.wait_ready()
        answers.send("before", "post session", "POST", f"{url}/sessions", json=session_body(first))

        # 1. Dropped between requests: whichever request comes next succeeds (and so does the one after).
        for what, (method, path) in READS.items():
            assert postgres_cluster.terminate_connections(database) > 0
            body = {"json": {"query": word_for("s1")}} if what == "search" else {}
            answers.send(f"dropped before {what}", what, method, url + path, **body)
            answers.send(f"dropped before {what}", "get session", "GET", f"{url}/sessions/s1")
        postgres_cluster.terminate_connections(database)
        answers.send("dropped before a post", "post session", "POST", f"{url}/sessions", json=session_body(second))
        answers.send("dropped before a post", "get session", "GET", f"{url}/sessions/{second.session_id}")
        assert all(status in (200, 202) for _, _, status, _, _ in answers.rows), (
            f"the request after a dropped connection must succeed:\n{answers}"
        )

        # 2. Dropped while a session's write waits to commit (its turns written): the client hears
        #    503 store_unavailable, nothing of the session is stored, the next requests succeed.
        outcome: list[httpx.Response] = []
        with store_changes_held(postgres_url):
            post = threading.Thread(
                target=lambda: outcome.append(client.post(f"{url}/sessions", json=session_body(third)))
            )
            post.start()
            wait_for_writer(postgres_url, "turns")
            postgres_cluster.terminate_connections(database)
            post.join(30)
        assert outcome, "the request did not return"
        assert (outcome[0].status_code, error_code(outcome[0])) == (503, "store_unavailable"), outcome[0].text
        assert set(stored(postgres_url)) == {("alice", s.session_id) for s in (first, second)}, "a half session"
        with pg_connect(postgres_url) as conn:
            assert conn.execute("SELECT count(*) FROM turns").fetchone()[0] == 2 * TURNS
        response = client.get(f"{url}/sessions/{first.session_id}")
        assert response.status_code == 200, f"the next request: {response.status_code} {response.text}"
        for session in (third, fourth):  # the client retries; and goes on
            response = client.post(f"{url}/sessions", json=session_body(session))
            assert response.status_code == 202, response.text
        rows = stored(postgres_url)
        assert set(rows) == {("alice", s.session_id) for s in (first, second, third, fourth)}
        assert all(row["turns"] == TURNS and row["logged"] == 1 for row in rows.values()), rows
    finally:
        client.close()
        llm.stop()
        stop_all([server])


@pytest.mark.slow
def test_connection_dropped_while_a_worker_stores_a_curation(postgres_cluster, postgres_url, tmp_path):
    llm = ChatServer(lambda body, attempt: Sleep(LLM_S, curation_reply(body)))
    server = ServeProcess(
        tmp_path / "unused.db", base_overrides(llm, postgres_url, tmp_path / "r1"), tmp_path / "serve.log"
    )
    [session] = worded_sessions(("alice",), each=1)
    accepted = {("alice", session.session_id)}
    try:
        server.wait_ready()
        response = httpx.post(f"{server.base_url}/v1/namespaces/alice/sessions", json=session_body(session))
        assert response.status_code == 202, response.text
        wait_until(lambda: len(llm.requests) >= 1, 30, "the batch to reach the LLM", server)
        with store_changes_held(postgres_url):
            # The worker's transaction waits to commit with the session's memories written.
            wait_for_writer(postgres_url, "memories", timeout_s=LLM_S + 20)
            assert assert_accepted_are_whole(postgres_url, accepted) == {"pending": 1, "curated": 0}
            postgres_cluster.terminate_connections(database_name(postgres_url))
        # The curation was rolled back whole; the worker curates the session again, once.
        wait_until(
            lambda: stored(postgres_url)[("alice", session.session_id)]["status"] != "pending",
            LEASE_S + LLM_S + 20,
            "the session to leave pending",
            server,
        )
        row = stored(postgres_url)[("alice", session.session_id)]
        assert row["status"] == "curated", f"a dropped connection left the session {row['status']}: {row}"
        assert assert_accepted_are_whole(postgres_url, accepted) == {"pending": 0, "curated": 1}
        assert httpx.get(f"{server.base_url}/readyz").status_code == 200
    finally:
        llm.stop()
        stop_all([server])
