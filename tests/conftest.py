"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

# stevedore writes its entry-point cache under XDG_CACHE_HOME when first imported: keep the
# suite's caches out of the user's home.
os.environ.setdefault("XDG_CACHE_HOME", tempfile.mkdtemp(prefix="worker-tests-cache-"))

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def _has_django_tasks() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("django.tasks") is not None
    except ImportError:
        return False


# Django's own tests of its task backends need Django 6 (django.tasks): make test-django6 runs them
collect_ignore = [] if _has_django_tasks() else ["test_django_suite.py"]


class FakeSite:
    """A directory on ``sys.path`` holding fake installed distributions with entry points.

    Real ``importlib.metadata`` (and so stevedore) finds them exactly as it finds pip-installed
    distributions, which lets tests install broken, conflicting or third-party plugins in-process.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: set[str] = set()

    def add(
        self,
        dist: str,
        entry_points: Mapping[str, Mapping[str, str]],
        modules: Mapping[str, str] | None = None,
        version: str = "1.0",
    ) -> None:
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = []
        for group, names in entry_points.items():
            lines.append(f"[{group}]")
            lines.extend(f"{name} = {target}" for name, target in names.items())
            lines.append("")
        (info / "entry_points.txt").write_text("\n".join(lines))
        for module, source in (modules or {}).items():
            path = self.root / (module.replace(".", "/") + ".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            for parent in path.relative_to(self.root).parents:
                if str(parent) != ".":
                    (self.root / parent / "__init__.py").touch()
            path.write_text(textwrap.dedent(source))
            self.modules.add(module.split(".")[0])
        _forget_caches()


def _forget_caches() -> None:
    import importlib

    from worker_core.plugins.entrypoints import forget_distributions

    forget_distributions()
    importlib.invalidate_caches()
    from stevedore import _cache  # test-only: drop stevedore's in-memory scans
    from stevedore.extension import ExtensionManager

    _cache._c._internal.clear()
    ExtensionManager.ENTRY_POINT_CACHE.clear()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSite]:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    fake = FakeSite(root)
    _forget_caches()
    yield fake
    for name in list(sys.modules):
        if name.split(".")[0] in fake.modules:
            del sys.modules[name]
    monkeypatch.undo()
    _forget_caches()


def _test_apps() -> list:
    """The module-level apps of tests/apps that tests have imported (``apps.basic.app``, ...)."""
    from worker_core import App

    found = []
    for name, module in list(sys.modules.items()):
        if name.startswith("apps.") and isinstance(getattr(module, "app", None), App):
            found.append(module.app)
    return found


@pytest.fixture(scope="module", autouse=True)
def _each_module_leaves_the_process_as_it_found_it() -> Iterator[None]:
    """Test modules share one process under pytest-xdist: what one changes of the environment,
    the working directory or a shared app's settings (``basic.app.conf.update(...)`` in a
    module's fixtures) is put back when it ends, so that the next module never runs on a broker
    URL or transport options meant for another (a PostgreSQL schema option reaching an embedded
    broker, say)."""
    environ = dict(os.environ)
    cwd = os.getcwd()
    apps = [(app, app.settings, app._overrides, app._config_object) for app in _test_apps()]
    yield
    if dict(os.environ) != environ:
        os.environ.clear()
        os.environ.update(environ)
    if os.getcwd() != cwd:
        os.chdir(cwd)
    for app, settings, overrides, config_object in apps:
        if app.settings is not settings:
            app.settings, app._overrides, app._config_object = settings, overrides, config_object
            app._reset_connections()


# -- brokers -----------------------------------------------------------------------------------

#: the pytest-xdist worker this process is ("gw0", "gw1", ...), or None in a serial run
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")


class _PrivateBrokers:
    """Under pytest-xdist each worker process gets brokers of its own, so that tests running at
    the same time never share a Redis database, a queue, an event exchange or a remote-control
    mailbox: a redis-server of its own on a free port, and a RabbitMQ virtual host of its own on
    the shared RabbitMQ. Both are created when the worker's conftest is imported (the module-level
    URLs below name them) and removed in pytest_unconfigure."""

    def __init__(self, name: str) -> None:
        self.redis = None
        self.vhost = f"worker-tests-{name}-{os.getpid()}"
        self.vhost_created = False

    def start_redis(self) -> str:
        from faults import RedisServer

        directory = Path(tempfile.mkdtemp(prefix="worker-tests-redis-"))
        for attempt in range(3):
            try:
                self.redis = RedisServer(directory).start()
                break
            except RuntimeError:  # the free port was taken meanwhile
                if attempt == 2:
                    raise
        return f"127.0.0.1:{self.redis.port}"

    def create_vhost(self) -> str:
        program = shutil.which("rabbitmqctl")
        if program is None:
            raise RuntimeError("rabbitmqctl is needed to give each pytest-xdist worker a RabbitMQ "
                               "virtual host of its own (or run the suite without -n)")
        subprocess.run([program, "-q", "add_vhost", self.vhost], check=True, capture_output=True, timeout=60)
        self.vhost_created = True
        subprocess.run([program, "-q", "set_permissions", "-p", self.vhost, "guest", ".*", ".*", ".*"],
                       check=True, capture_output=True, timeout=60)
        return self.vhost

    def stop(self) -> None:
        if self.redis is not None:
            self.redis.stop()
            shutil.rmtree(self.redis.directory, ignore_errors=True)
            self.redis = None
        if self.vhost_created:
            self.vhost_created = False
            subprocess.run([shutil.which("rabbitmqctl") or "rabbitmqctl", "-q", "delete_vhost", self.vhost],
                           capture_output=True, timeout=60)


_PRIVATE = _PrivateBrokers(XDIST_WORKER) if XDIST_WORKER else None

if _PRIVATE is not None:
    # subprocesses (workers, the apps under tests/apps) read WORKER_TEST_REDIS too
    os.environ["WORKER_TEST_REDIS"] = _PRIVATE.start_redis()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _PRIVATE is not None:
        import gc

        # Celery's results still waiting to be collected unsubscribe from their Redis when they
        # go: let them go while it runs, not at the interpreter's exit after it stopped
        gc.collect()
        _PRIVATE.stop()


#: the Redis the suite uses; WORKER_TEST_REDIS=127.0.0.1:<port> runs it against another server
#: (under pytest-xdist: the worker's own redis-server, see _PrivateBrokers)
REDIS_ADDRESS = os.environ.get("WORKER_TEST_REDIS", "127.0.0.1:6379")
REDIS_PORT = int(REDIS_ADDRESS.rpartition(":")[2])


def redis_db(db: int) -> str:
    """The URL of database ``db`` of the suite's Redis."""
    return f"redis://{REDIS_ADDRESS}/{db}"


REDIS_TEST_URL = redis_db(13)  # a database of the shared Redis kept for the suite
#: the RabbitMQ virtual host of the suite: the default one, or under pytest-xdist the worker's own
AMQP_VHOST = _PRIVATE.create_vhost() if _PRIVATE is not None else "/"


def amqp_url_on(port: int = 5672, user: str = "guest:guest") -> str:
    """The URL of the suite's RabbitMQ virtual host through ``port`` (5672, or a proxy's)."""
    return f"amqp://{user}@127.0.0.1:{port}/{AMQP_VHOST}"


AMQP_TEST_URL = amqp_url_on()


def require_server(port: int, what: str) -> None:
    """Skip when the shared broker is not running, except in CI where that is a failure."""
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
    except OSError:
        if os.environ.get("CI"):
            pytest.fail(f"{what} does not answer on 127.0.0.1:{port} and CI is set")
        pytest.skip(f"{what} is not running on 127.0.0.1:{port}")


def empty_redis(url: str) -> str:
    """Empty the one database of the shared Redis that ``url`` names, and give ``url`` back."""
    require_server(REDIS_PORT, "Redis")
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()
    return url


def delete_queue(broker: str, name: str) -> None:
    """Delete the queue ``name`` and its exchange from RabbitMQ, which keeps them; a worker still
    consuming from it would declare them again, so stop the test's workers first. Other brokers:
    nothing to do."""
    if not broker.startswith("amqp"):
        return
    import kombu

    with kombu.Connection(broker) as connection:
        connection.default_channel.queue_delete(name)
        connection.default_channel.exchange_delete(name)


@pytest.fixture
def redis_url() -> str:
    """The suite's Redis database, emptied before the test (never another database)."""
    return empty_redis(REDIS_TEST_URL)


@pytest.fixture
def embedded_broker(tmp_path: Path) -> Iterator[str]:
    """A queue file of the test's own, as ``apps.basic``'s broker (results off)."""
    from apps import basic

    url = f"embedded://{tmp_path}/queue.db"
    basic.app.conf.update(broker_url=url, result_backend=None)
    yield url
    basic.app.close()


@pytest.fixture
def amqp_url() -> str:
    require_server(5672, "RabbitMQ")
    return AMQP_TEST_URL


# -- real worker processes ------------------------------------------------------------------------


class WorkerFactory:
    """Starts ``workerctl worker`` (or ``celery worker``) processes and kills leftovers."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list = []

    def start(self, *args: str, app: str = "apps.basic", pool: str = "solo", broker: str | None = None,
              backend: str | None = None, env: dict[str, str] | None = None, ready: bool = True,
              loglevel: str = "INFO"):
        from workers import WorkerProcess

        environment = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        if broker:
            environment["WORKER_BROKER_URL"] = broker
        if backend:
            environment["WORKER_RESULT_BACKEND"] = backend
        log = self.tmp_path / f"worker-{len(self.started)}.log"
        name = [] if "-n" in args else ["-n", f"test-{uuid.uuid4().hex[:8]}@localhost"]
        worker = WorkerProcess(["-A", app, "-P", pool, "-l", loglevel, *name, *args], environment, log)
        self.started.append(worker)
        return worker.wait_ready() if ready else worker

    def start_celery(self, *args: str, app: str = "apps.celery_basic", broker: str,
                     backend: str | None = None, pool: str = "solo", ready: bool = True,
                     env: dict[str, str] | None = None):
        from workers import CeleryWorkerProcess

        environment = dict(os.environ, PYTHONUNBUFFERED="1", CELERY_BROKER_URL=broker, **(env or {}))
        if backend:
            environment["CELERY_RESULT_BACKEND"] = backend
        log = self.tmp_path / f"celery-{len(self.started)}.log"
        worker = CeleryWorkerProcess(["-A", app, "worker", "-P", pool, "-l", "INFO", "--without-gossip",
                                      "--without-mingle", "--without-heartbeat",
                                      "-n", f"celery-{uuid.uuid4().hex[:8]}@localhost", *args],
                                     environment, log)
        self.started.append(worker)
        return worker.wait_ready() if ready else worker

    def cleanup(self) -> None:
        for worker in self.started:
            worker.kill()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


_REPORTS = pytest.StashKey[dict]()


@pytest.fixture
def workers(request: pytest.FixtureRequest, tmp_path: Path):
    factory = WorkerFactory(tmp_path)
    yield factory
    factory.cleanup()
    call = request.node.stash.get(_REPORTS, {}).get("call")
    if call is not None and call.failed:  # the workers' logs go with the failure's report
        for worker in factory.started:
            print(f"--- {worker.log_path.name} ---\n{worker.log()[-20000:]}")


# -- a Redis Cluster of the suite's own ------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory):
    """Six redis-server processes on free ports (three primaries, a replica each), made one cluster
    with ``redis-cli --cluster create``, shared by the tests of this pytest process and stopped at
    its end. A test that kills or moves something leaves the cluster healthy again."""
    from redis_cluster import RedisCluster
    from tls_servers import require_program

    require_program("redis-server")
    require_program("redis-cli")
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
