"""A throwaway PostgreSQL cluster for tests: ``initdb`` into a temporary directory, ``postgres`` on a
free loopback port, stopped by its pid and deleted afterwards.

The server refuses to run as root, so as root (CI) the directory belongs to the ``postgres`` user
and the binaries run through ``runuser -u postgres``. ``fsync=off`` trades durability against an OS
crash for speed; a killed server (:meth:`PostgresCluster.kill`) still recovers every committed
transaction, because ``synchronous_commit`` stays on: with fsync off a commit costs one write() to
the kernel, and a commit the client saw must survive a process crash (the fault tests rely on it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SERVER_USER = "postgres"
#: Each cluster's directory, and the file in it naming the test process that owns it.
DIR_PREFIX, OWNER_FILE = "hybridmem-pg-", "owner.pid"
DEFAULT_DATABASE = "hybridmem"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
# --no-locale: the same collation everywhere; --no-sync: nothing here must survive a reboot.
INITDB_ARGS = ["-A", "trust", "-U", SERVER_USER, "--no-locale", "-E", "UTF8", "--no-sync"]
SERVER_SETTINGS = {"listen_addresses": "127.0.0.1", "fsync": "off", "full_page_writes": "off", "max_connections": "200"}


def postgres_binaries() -> Path | None:
    """The server's bin directory (with initdb and postgres): ``pg_config --bindir``, else the newest
    /usr/lib/postgresql/*/bin; None when there is none."""
    candidates: list[Path] = []
    if pg_config := shutil.which("pg_config"):
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True)
            candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass  # a broken pg_config: fall back to the Debian layout
    versions = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(versions, key=lambda d: [int(n) for n in re.findall(r"\d+", d.parent.name)], reverse=True)
    return next((d for d in candidates if (d / "initdb").is_file() and (d / "postgres").is_file()), None)


def skip_reason() -> str | None:
    """Why a throwaway cluster cannot run here, or None when it can."""
    if postgres_binaries() is None:
        return (
            "PostgreSQL server binaries not found (no initdb/postgres under `pg_config --bindir` or "
            "/usr/lib/postgresql/*/bin): install postgresql-15 to run the postgres tests"
        )
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed: pip install 'psycopg[binary]>=3.2' to run the postgres tests"
    if os.geteuid() == 0 and (
        shutil.which("runuser") is None or SERVER_USER not in {u.pw_name for u in pwd.getpwall()}
    ):
        return "running as root: the server (which refuses root) needs a postgres user and runuser to run as it"
    return None


def sweep_orphans(parent: Path) -> list[Path]:
    """Stop and delete the clusters under ``parent`` whose test process died without stopping them
    (a run killed from outside never reaches its teardown; the server runs in a session of its own
    and would outlive it); returns their directories. A cluster whose owner still runs is left alone."""
    swept = []
    for base in parent.glob(DIR_PREFIX + "*"):
        try:
            owner = int((base / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # no owner recorded: not ours to judge
        if _alive(owner):
            continue
        try:
            postmaster = int((base / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            postmaster = 0  # the server never started, or stopped cleanly
        server = [postmaster, *_children(postmaster)] if postmaster and _alive(postmaster) else []
        if server and str(base / "data") in _cmdline(postmaster):  # not a reused pid
            _signal(server, signal.SIGKILL)  # nothing in it is worth a clean shutdown
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while any(_alive(p) for p in server) and time.monotonic() < deadline:
                time.sleep(0.02)
        shutil.rmtree(base, ignore_errors=True)
        swept.append(base)
    return swept


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _proc_stat(pid: int | str) -> list[str]:
    """/proc/PID/stat after the command name: [state, ppid, ...]; [] once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    return _proc_stat(pid)[:1] not in ([], ["Z"], ["X"])


def _children(pid: int) -> list[int]:
    """The postmaster's children: each calls setsid(), so a process-group kill would miss them."""
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _proc_stat(d.name)[1:2] == [str(pid)]]


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # exited meanwhile
            os.kill(pid, sig)


class PostgresCluster:
    """One ``postgres`` server on its own data directory; a context manager (start/stop).

    ``base_dir`` (created, and deleted by :meth:`stop`) holds ``data/``, the socket and
    ``postgres.log``; as root its parents must be traversable by the postgres user, which pytest's
    0700 ``tmp_path`` parents are not, so by default it is a fresh ``mkdtemp`` under /tmp.
    """

    def __init__(self, base_dir: Path | None = None, database: str = DEFAULT_DATABASE) -> None:
        self.base_dir = base_dir
        self.database = database
        self.port: int | None = None
        self.pid: int | None = None  # the postmaster's (under runuser, Popen's pid is runuser's)
        self._proc: subprocess.Popen | None = None
        self._as_root = os.geteuid() == 0

    def __enter__(self) -> PostgresCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def data_dir(self) -> Path:
        assert self.base_dir is not None, "the cluster was never started"
        return self.base_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / "postgres.log"

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://{SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def dsn_for(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={SERVER_USER} dbname={database}"

    @property
    def url(self) -> str:  # SQLAlchemy's, of the default database
        return self.url_for(self.database)

    @property
    def dsn(self) -> str:  # psycopg's, of the default database
        return self.dsn_for(self.database)

    def start(self) -> PostgresCluster:
        """initdb, start the server on a free port (retrying on a clash), create the default database."""
        if reason := skip_reason():
            raise RuntimeError(reason)
        if self.base_dir is None:
            parent = Path("/tmp" if self._as_root else tempfile.gettempdir())
            sweep_orphans(parent)
            self.base_dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=parent))
        try:
            self.base_dir.mkdir(parents=True, exist_ok=True)
            self.base_dir.chmod(0o755)
            (self.base_dir / OWNER_FILE).write_text(str(os.getpid()))
            if self._as_root:
                shutil.chown(self.base_dir, SERVER_USER, SERVER_USER)
            self._run("initdb", "-D", str(self.data_dir), *INITDB_ARGS)
            if not any(self._launch(_free_port()) for _ in range(5)):
                raise RuntimeError(f"no free port after 5 tries:\n{self._log_tail()}")
            self.create_database(self.database)
        except BaseException:
            self.stop()  # a half-started cluster leaves neither a process nor a directory behind
            raise
        return self

    def restart(self) -> None:
        """Stop the server (fast shutdown; nothing if it was killed) keeping its data, start it on the same port."""
        self._shutdown()
        self.start_again()

    def start_again(self) -> None:
        """Start the stopped or killed server on its data and port (after :meth:`kill`: crash recovery)."""
        if self._proc is not None:
            raise RuntimeError("the server is already running")
        if not self._launch(self.port):
            raise RuntimeError(f"port {self.port} was taken while the server was down:\n{self._log_tail()}")

    def kill(self) -> None:
        """SIGKILL the postmaster and its children, as a crash would; :meth:`restart` recovers."""
        self._shutdown(signal.SIGKILL)

    def stop(self) -> None:
        """Fast shutdown by the postmaster's pid (SIGKILL after STOP_TIMEOUT_S), then delete base_dir."""
        self._shutdown()
        if self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """Create the empty database ``name`` and return its SQLAlchemy URL."""
        from psycopg import sql

        self._admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        from psycopg import sql

        self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def terminate_connections(self, database: str) -> int:
        """pg_terminate_backend every connection to ``database`` (ours is to ``postgres``); wait until they
        are gone and return how many there were."""
        query = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        pids = [pid for (pid,) in self._admin(query, (database,))]
        # A query of its own: in one WHERE, the planner may call pg_terminate_backend before the
        # datname filter, on every backend (ours included).
        self._admin("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while pids and self._admin(query + " AND pid = ANY(%s)", (database, pids)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"backends {pids} on {database} did not exit")
            time.sleep(0.02)
        return len(pids)

    # -- internals --

    def _command(self, binary: str, *args: str) -> list[str]:
        bindir = postgres_binaries()
        assert bindir is not None
        command = [str(bindir / binary), *args]
        return ["runuser", "-u", SERVER_USER, "--", *command] if self._as_root else command

    def _run(self, binary: str, *args: str) -> None:
        done = subprocess.run(self._command(binary, *args), cwd=self.base_dir, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{binary} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    def _admin(self, query, params: tuple = ()) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.dsn_for("postgres"), autocommit=True) as conn:
            cursor = conn.execute(query, params or None)
            return cursor.fetchall() if cursor.description else []

    def _log_tail(self, start: int = 0) -> str:
        return self.log_path.read_bytes()[start:][-3000:].decode(errors="replace")

    def _launch(self, port: int | None) -> bool:
        """Start postgres on ``port`` and wait until it accepts connections; False on a port clash."""
        assert port is not None
        settings = [arg for key, value in SERVER_SETTINGS.items() for arg in ("-c", f"{key}={value}")]
        command = self._command("postgres", "-D", str(self.data_dir), "-p", str(port), "-k", str(self.base_dir))
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            # A session of its own: a Ctrl-C at the terminal must not stop it behind the fixture's back.
            proc = subprocess.Popen(
                command + settings, cwd=self.base_dir, stdout=log, stderr=log, start_new_session=True
            )
        self._proc, self.port = proc, port
        if not self._wait_ready(proc, log_start):
            self._proc = None
            return False
        self.pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        return True

    def _wait_ready(self, proc: subprocess.Popen, log_start: int) -> bool:
        import psycopg

        deadline = time.monotonic() + START_TIMEOUT_S
        while proc.poll() is None:
            try:
                psycopg.connect(self.dsn_for("postgres"), connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    os.killpg(proc.pid, signal.SIGKILL)  # runuser and the postmaster (not yet setsid'd children)
                    proc.wait()
                    self._proc = None
                    raise RuntimeError(
                        f"postgres not up after {START_TIMEOUT_S}s:\n{self._log_tail(log_start)}"
                    ) from None
                time.sleep(0.1)
        tail = self._log_tail(log_start)
        if "could not bind" in tail or "Address already in use" in tail:
            return False
        raise RuntimeError(f"postgres exited ({proc.returncode}) while starting:\n{tail}")

    def _shutdown(self, sig: signal.Signals = signal.SIGINT) -> None:
        """Signal the postmaster by its pid (SIGINT = fast shutdown) and wait until it and its
        children are gone, escalating to SIGKILL after STOP_TIMEOUT_S."""
        if self._proc is None or self.pid is None:
            return
        pid, children = self.pid, _children(self.pid)
        # A crash takes the backends too: none is left holding the shared memory a restart needs.
        _signal([pid, *children] if sig == signal.SIGKILL else [pid], sig)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(_alive(p) for p in (pid, *children)):
            if time.monotonic() > deadline:
                _signal([p for p in (pid, *children) if _alive(p)], signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.02)
        self._proc.wait(timeout=STOP_TIMEOUT_S)  # runuser exits with the postmaster; or reap our own child
        self._proc = self.pid = None
