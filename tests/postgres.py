"""PostgreSQL for the tests: the shared server's database ``test`` with a schema of each test
module's own (never shared between pytest processes, dropped afterwards), clusters of a test's
own on free ports (started with Debian's initdb/pg_ctl in a temporary directory), which a test
may restart or promote, and a PgBouncer of a test's own in front of the shared server; the
shared server on 5432 is never stopped."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from faults import answers, free_port
from workers import wait_for

__all__ = ["POSTGRES_URL", "Cluster", "PgBouncer", "drop_schema", "schema_name", "temporary_schema"]

#: the shared server's database for the tests (WORKER_TEST_POSTGRES overrides it)
POSTGRES_URL = os.environ.get("WORKER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def schema_name(prefix: str = "worker_tests") -> str:
    """A schema name no other pytest process (or earlier run) uses."""
    return f"{prefix}_{os.environ.get('PYTEST_XDIST_WORKER', 'serial')}_{os.getpid()}_{uuid.uuid4().hex[:6]}"


def drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextlib.contextmanager
def temporary_schema(url: str = POSTGRES_URL, prefix: str = "worker_tests") -> Iterator[str]:
    schema = schema_name(prefix)
    try:
        yield schema
    finally:
        drop_schema(url, schema)


def _program(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    program = shutil.which(name)
    if program is None:
        raise RuntimeError(f"{name} is not installed (Debian: apt-get install postgresql)")
    return program


class Cluster:
    """A PostgreSQL cluster of a test's own: ``initdb`` in a temporary directory, served on a free port
    of 127.0.0.1 with trust authentication, stopped by ``pg_ctl`` (never the shared server)."""

    def __init__(self, port: int | None = None) -> None:
        # (not under pytest's tmp_path: the postgres user could not reach it as root runs the tests)
        self.directory = Path(tempfile.mkdtemp(prefix="worker-tests-postgres-"))
        self.data = self.directory / "data"
        self.port = port or free_port()
        self.log = self.directory / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        # initdb and postgres refuse to run as root: run them as the postgres user then
        command = list(args)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def init(self, *, primary: Cluster | None = None) -> Cluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
        if primary is None:
            self._run(
                _program("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
            )
        else:  # a streaming standby of ``primary``
            self._run(
                _program("pg_basebackup"),
                "-D",
                str(self.data),
                "-h",
                "127.0.0.1",
                "-p",
                str(primary.port),
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
            )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = "
                f"'{self.directory}'\nfsync = off\nmax_connections = 40\nwal_level = replica\n"
                f"max_wal_senders = 4\n"
            )
        return self

    def start(self) -> Cluster:
        self._run(_program("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        wait_for(lambda: answers(self.port), 30, interval=0.05,
                 message=lambda: f"PostgreSQL on port {self.port} to start: {self.log.read_text()}")
        return self

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(_program("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def remove(self) -> None:
        """Stop it (at once) and delete its files."""
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.directory, ignore_errors=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def promote(self) -> None:
        self._run(_program("pg_ctl"), "-D", str(self.data), "-w", "promote")


class PgBouncer:
    """A PgBouncer of a test's own on a free port of 127.0.0.1, in front of the shared server
    (every database, trust authentication), in ``pool_mode`` with at most ``pool_size`` server
    connections per database and user; its admin console answers ``SHOW`` (:meth:`show`).
    Stopped by its pid (never another PgBouncer)."""

    def __init__(self, pool_mode: str = "transaction", pool_size: int = 3, server_port: int = 5432) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="worker-tests-pgbouncer-"))
        self.port = free_port()
        self.pool_mode, self.pool_size, self.server_port = pool_mode, pool_size, server_port
        self.log = self.directory / "pgbouncer.log"
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, database: str = "test") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> PgBouncer:
        program = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not os.path.exists(program):
            raise RuntimeError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        (self.directory / "users.txt").write_text('"postgres" ""\n')
        ini = self.directory / "pgbouncer.ini"
        ini.write_text(
            f"[databases]\n* = host=127.0.0.1 port={self.server_port}\n"
            f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.directory / 'users.txt'}\nadmin_users = postgres\n"
            f"pool_mode = {self.pool_mode}\ndefault_pool_size = {self.pool_size}\n"
            f"max_client_conn = 200\nlogfile = {self.log}\n"
        )
        # PgBouncer refuses to run as root: run it as the postgres user then
        user = None
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
            for path in self.directory.iterdir():
                shutil.chown(path, "postgres", "postgres")
            user = "postgres"
        self.process = subprocess.Popen([program, str(ini)], user=user, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        process = self.process
        try:
            wait_for(lambda: answers(self.port) or process.poll() is not None, 30, interval=0.05,
                     message=f"PgBouncer on port {self.port} to start")
            if process.poll() is not None:
                raise RuntimeError(f"PgBouncer on port {self.port} did not start: "
                                   f"{self.log.read_text() if self.log.exists() else ''}")
        except BaseException:
            self.stop()
            raise
        return self

    def show(self, what: str) -> list[dict[str, object]]:
        """``SHOW <what>`` on the admin console (``CLIENTS``, ``SERVERS``, ``POOLS``), as dicts."""
        import psycopg

        # (the console speaks the simple query protocol only)
        console = self.url("pgbouncer")
        with psycopg.connect(console, autocommit=True, cursor_factory=psycopg.ClientCursor) as db:
            cursor = db.execute(f"SHOW {what}")
            names = [column.name for column in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)
