"""The throwaway PostgreSQL cluster the postgres tests run on (tests/postgres_cluster.py): it starts,
keeps databases apart, survives a restart and a crash, and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres_cluster import PostgresCluster, _alive, skip_reason

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[PostgresCluster]:
    """A cluster of this module's own, for the tests that restart or kill it (never the shared one)."""
    if reason := skip_reason():
        pytest.skip(reason)
    with PostgresCluster() as cluster:
        yield cluster


def _count(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM notes").fetchone()[0]


def _insert_committed(dsn: str, *texts: str) -> None:
    import psycopg

    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS notes (text text)")
        for text in texts:
            conn.execute("INSERT INTO notes VALUES (%s)", (text,))
    # the block committed on exit


def test_cluster_accepts_connections(postgres_cluster):
    import psycopg

    with psycopg.connect(postgres_cluster.dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute("SELECT current_database()").fetchone() == ("hybridmem",)
    assert postgres_cluster.url == f"postgresql+psycopg://postgres@127.0.0.1:{postgres_cluster.port}/hybridmem"
    os.kill(postgres_cluster.pid, 0)  # the postmaster's own pid, not runuser's
    assert (postgres_cluster.data_dir / "postmaster.pid").read_text().split()[0] == str(postgres_cluster.pid)


def test_each_postgres_url_is_a_separate_database(postgres_cluster, postgres_url):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    other_url = postgres_cluster.create_database("test_other_database")
    try:
        first, other = sqlalchemy.create_engine(postgres_url), sqlalchemy.create_engine(other_url)
        with first.begin() as conn:
            conn.execute(sqlalchemy.text("CREATE TABLE notes (text text)"))
            conn.execute(sqlalchemy.text("INSERT INTO notes VALUES ('only here')"))
        assert sqlalchemy.inspect(first).has_table("notes")
        assert not sqlalchemy.inspect(other).has_table("notes")
        first.dispose()
        other.dispose()
    finally:
        postgres_cluster.drop_database("test_other_database")


def test_terminate_connections_drops_a_transaction_midway(postgres_cluster, postgres_url):
    import psycopg

    database = postgres_url.rsplit("/", 1)[1]
    conn = psycopg.connect(postgres_cluster.dsn_for(database))
    conn.execute("CREATE TABLE notes (text text)")
    conn.execute("INSERT INTO notes VALUES ('uncommitted')")
    assert postgres_cluster.terminate_connections(database) == 1
    with pytest.raises(psycopg.OperationalError):
        conn.execute("INSERT INTO notes VALUES ('after the drop')")
    conn.close()
    with psycopg.connect(postgres_cluster.dsn_for(database)) as fresh:
        assert fresh.execute("SELECT to_regclass('notes')").fetchone() == (None,)  # rolled back


def test_restart_keeps_committed_data(own_cluster):
    _insert_committed(own_cluster.dsn, "before restart")
    port, pid = own_cluster.port, own_cluster.pid
    own_cluster.restart()
    assert own_cluster.port == port
    assert own_cluster.pid != pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert _count(own_cluster.dsn) == 1


def test_kill_then_restart_recovers_committed_data(own_cluster):
    _insert_committed(own_cluster.dsn, *(f"note {i}" for i in range(100)))
    committed = _count(own_cluster.dsn)
    pid = own_cluster.pid
    own_cluster.kill()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    own_cluster.restart()  # crash recovery replays the WAL
    assert _count(own_cluster.dsn) == committed
    assert "database system was interrupted" in own_cluster.log_path.read_text()


def test_stop_ends_the_server_and_removes_its_directory():
    if reason := skip_reason():
        pytest.skip(reason)
    with PostgresCluster() as cluster:
        pid, base_dir = cluster.pid, cluster.base_dir
        assert pid is not None and base_dir is not None and base_dir.is_dir()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not base_dir.exists()


def test_a_cluster_whose_test_run_was_killed_is_swept_by_the_next_start():
    """A run killed from outside never stops its server (in a session of its own, it outlives the
    run): the next cluster start stops it and deletes its directory; a live run's is left alone."""
    if reason := skip_reason():
        pytest.skip(reason)
    starts = (
        "import time; from tests.postgres_cluster import PostgresCluster; c = PostgresCluster().start(); "
        "print(c.base_dir, c.pid, flush=True); time.sleep(600)"
    )
    repo = Path(__file__).resolve().parents[1]
    killed_run = subprocess.Popen([sys.executable, "-c", starts], cwd=repo, stdout=subprocess.PIPE, text=True)
    base_dir, pid = killed_run.stdout.readline().split()
    killed_run.kill()
    killed_run.wait()
    assert _alive(int(pid))  # the orphan: its run is gone, the server still runs
    with PostgresCluster() as live, PostgresCluster() as next_one:
        assert live.base_dir.is_dir() and next_one.pid is not None  # the live run's cluster stays
    # Gone, or a zombie that a container's init may never reap.
    assert not _alive(int(pid)) and not Path(base_dir).exists()
