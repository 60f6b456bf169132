"""Slot implementations and their Protocols: every installed one satisfies its slot, a class that
does not is refused when it loads (naming what it lacks), capabilities are tested with isinstance,
and URL schemes with ``+`` find their plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeSite, redis_db

from worker_core.app.base import App
from worker_core.app.settings import Settings
from worker_core.exceptions import PluginLoadError, PluginNotFoundError
from worker_core.options import scheme_of
from worker_core.plugins import SLOT_GROUPS, PluginManager
from worker_core.plugins.conformance import conformance_problem, protocol_members
from worker_core.pools.solo import SoloPool
from worker_core.selection import default_result_url
from worker_core.slots import (
    CAPABILITIES,
    REQUIRED,
    AcksSurviveReconnect,
    AdoptsQueues,
    BuffersDeliveries,
    DelaysOnBroker,
    FansOutEvents,
    FixedConcurrency,
    LeasesMessages,
    OffersResultBackend,
    PoolOptions,
    SharesOneQueue,
    SuccessIsFinal,
    WithdrawsOneJob,
)
from worker_core.transports.embedded import EmbeddedTransport

INSTALLED = [
    (kind, entry.name) for kind in SLOT_GROUPS for entry in PluginManager(autoload=False).entries(kind)
]

#: A complete result backend without wait_for and forget, as a third party might ship it.
HALF_A_BACKEND = """
class Backend:
    def __init__(self, url, settings):
        self.url = url

    def store_result(self, task_id, result, state, traceback=None, request=None):
        pass

    def get_task_meta(self, task_id):
        return {"status": "PENDING", "result": None, "task_id": task_id}

    def on_task_call(self, task_id):
        pass

    def close(self):
        pass
"""

#: A whole result backend: the embedded one under another name.
WHOLE_BACKEND = """
from worker_core.results.embedded import EmbeddedBackend

class Backend(EmbeddedBackend):
    # the embedded backend, reached through another scheme (db+sqlite:///path)

    def __init__(self, url, settings):
        super().__init__("embedded://" + url.partition("://")[2], settings)
"""


# -- every installed implementation ----------------------------------------------------------------


@pytest.mark.parametrize(("kind", "name"), INSTALLED, ids=[f"{kind}:{name}" for kind, name in INSTALLED])
def test_every_installed_implementation_satisfies_its_slot_protocol(kind: str, name: str) -> None:
    implementation = PluginManager(autoload=False).slot(kind, name)
    protocol = REQUIRED[kind]
    assert conformance_problem(kind, implementation) is None
    assert isinstance(implementation, protocol), f"{kind} {name!r} is not a {protocol.__name__}"
    for capability in CAPABILITIES[kind]:
        if any(hasattr(implementation, member) for member in protocol_members(capability, own=True)):
            assert isinstance(implementation, capability), f"{kind} {name!r} offers part of {capability}"


def test_every_slot_has_a_protocol_and_its_capabilities() -> None:
    assert set(REQUIRED) == set(SLOT_GROUPS) == set(CAPABILITIES)


def _instances(tmp_path: Path) -> dict[tuple[str, str], Any]:
    """One instance of every built-in, built as the worker builds it (nothing connects)."""
    from worker_autoscale_backlog.autoscaler import BacklogAutoscaler
    from worker_core.autoscale.default import DemandAutoscaler
    from worker_core.failover import Priority, RoundRobin, Shuffle
    from worker_core.loops.hub import AsyncLoop
    from worker_core.loops.sync import SyncLoop
    from worker_core.results.disabled import DisabledBackend
    from worker_core.results.embedded import EmbeddedBackend
    from worker_core.results.rpc.backend import RPCBackend
    from worker_pool_prefork import PreforkPool
    from worker_pool_threads import ThreadPool
    from worker_transport_amqp.transport import AmqpTransport
    from worker_transport_redis.backend import RedisBackend
    from worker_transport_redis.transport import RedisTransport

    settings = Settings()
    sentinel = Settings(broker_transport_options={"master_name": "mymaster"},
                        result_backend_transport_options={"master_name": "mymaster"})
    embedded = f"embedded://{tmp_path}/queue.db"
    solo = SoloPool(PoolOptions(concurrency=1))
    urls = ["amqp://127.0.0.1//", "amqp://127.0.0.2//"]
    return {
        ("pool", "solo"): solo,
        ("pool", "threads"): ThreadPool(PoolOptions(concurrency=1)),
        ("pool", "prefork"): PreforkPool(PoolOptions(concurrency=1)),
        ("transport", "embedded"): EmbeddedTransport(embedded, settings),
        ("transport", "redis"): RedisTransport(redis_db(8), settings),
        ("transport", "sentinel"): RedisTransport("sentinel://127.0.0.1:26379", sentinel),
        ("transport", "amqp"): AmqpTransport("amqp://guest:guest@127.0.0.1:5672//", settings),
        ("loop", "sync"): SyncLoop(),
        ("loop", "async"): AsyncLoop(),
        ("autoscaler", "default"): DemandAutoscaler(solo, 2, 1, demand=lambda: 0),
        ("autoscaler", "backlog"): BacklogAutoscaler(solo, 2, 1, demand=lambda: 0, backlog=lambda: 0),
        ("failover", "round-robin"): RoundRobin(urls),
        ("failover", "shuffle"): Shuffle(urls),
        ("failover", "priority"): Priority(urls),
        ("result_backend", "embedded"): EmbeddedBackend(embedded, settings),
        ("result_backend", "redis"): RedisBackend(redis_db(7), settings),
        ("result_backend", "sentinel"): RedisBackend("sentinel://127.0.0.1:26379", sentinel),
        ("result_backend", "disabled"): DisabledBackend("disabled", settings),
        ("result_backend", "rpc"): RPCBackend("rpc://", settings),
    }


def test_every_built_in_instance_is_an_instance_of_its_slot_protocol(tmp_path: Path) -> None:
    instances = _instances(tmp_path)
    for (kind, name), instance in instances.items():
        protocol = REQUIRED[kind]
        assert isinstance(instance, protocol), f"{type(instance).__qualname__} is not a {protocol}"
        loaded = PluginManager(autoload=False).slot(kind, name)
        assert type(instance) is loaded, f"{kind} {name!r} is served by {loaded}, not {type(instance)}"
        for capability in CAPABILITIES[kind]:
            assert isinstance(instance, capability) == isinstance(loaded, capability), (
                f"{kind} {name!r}: the class and its instance disagree about {capability.__name__}")
    built = {(kind, name) for kind, name in instances}
    installed_built_ins = {(kind, name) for kind, name in INSTALLED
                           if PluginManager(autoload=False).slot_entry(kind, name).distribution in (
                               "worker-core", "worker-pool-prefork", "worker-pool-threads",
                               "worker-transport-redis", "worker-transport-amqp", "worker-autoscale-backlog")}
    served_by_another_name = {("transport", "rediss"), ("transport", "amqps"), ("transport", "pyamqp"),
                              ("result_backend", "rediss")}
    assert installed_built_ins - served_by_another_name <= built, "a built-in has no instance check"


def test_capabilities_are_tested_on_the_class_and_on_the_instance(tmp_path: Path) -> None:
    from worker_pool_prefork import PreforkPool
    from worker_pool_threads import ThreadPool
    from worker_transport_amqp.transport import AmqpTransport
    from worker_transport_redis.backend import RedisBackend
    from worker_transport_redis.transport import RedisTransport

    assert isinstance(SoloPool, FixedConcurrency) and SoloPool.fixed_concurrency == 1
    assert not isinstance(ThreadPool, FixedConcurrency)
    for pool in (ThreadPool, PreforkPool):
        assert isinstance(pool, SharesOneQueue) and pool.shared_queue
        assert isinstance(pool, WithdrawsOneJob)
    assert not isinstance(SoloPool, SharesOneQueue)
    assert not isinstance(SoloPool(PoolOptions(1)), WithdrawsOneJob)
    assert isinstance(RedisTransport, AcksSurviveReconnect) and RedisTransport.acks_survive_reconnect
    # AMQP declares the flag False: the same as not offering it
    assert not (isinstance(AmqpTransport, AcksSurviveReconnect) and AmqpTransport.acks_survive_reconnect)
    assert not isinstance(EmbeddedTransport, AcksSurviveReconnect)
    # Redis and the embedded transport lend messages for a visibility timeout, and renew the loan
    for leasing in (RedisTransport, EmbeddedTransport):
        assert isinstance(leasing, LeasesMessages) and leasing.renews_leases
        assert leasing.lease_timeout(Settings()) == 3600
        assert leasing.lease_timeout(Settings(broker_transport_options={"visibility_timeout": 30})) == 30
    assert not isinstance(AmqpTransport, LeasesMessages)
    assert isinstance(RedisBackend, SuccessIsFinal) and RedisBackend.success_is_final


def test_what_differs_between_brokers_is_a_capability_of_the_transport() -> None:
    """The core asks the transport, never the broker's name: RabbitMQ adopts queues that exist,
    holds countdowns and reads deliveries ahead of the loop; Redis fans events out; the embedded
    transport does none of these, the defaults."""
    from worker_transport_amqp.transport import AmqpTransport
    from worker_transport_redis.transport import RedisTransport

    assert isinstance(AmqpTransport, AdoptsQueues) and isinstance(AmqpTransport, DelaysOnBroker)
    assert isinstance(AmqpTransport, BuffersDeliveries) and AmqpTransport.buffers_deliveries
    assert not isinstance(AmqpTransport, FansOutEvents)
    assert isinstance(RedisTransport, FansOutEvents) and RedisTransport.fans_out_events
    for transport in (RedisTransport, EmbeddedTransport):
        assert not isinstance(transport, (AdoptsQueues, DelaysOnBroker, BuffersDeliveries))
    assert not isinstance(EmbeddedTransport, FansOutEvents)
    amqp = AmqpTransport("amqp://guest:guest@127.0.0.1:5672//", Settings())
    exchange, routing_key = amqp.delayed_route(5, "job.new")
    assert exchange == "celery_delayed_27"
    assert routing_key == "0." * 25 + "1.0.1.job.new"
    # a second delay replaces the bits of the first
    assert amqp.delayed_route(1, routing_key)[1] == "0." * 27 + "1.job.new"


def test_the_default_result_backend_comes_from_the_transport_that_offers_one(tmp_path: Path) -> None:
    from worker_transport_redis.transport import RedisTransport

    url = f"embedded://{tmp_path}/queue.db"
    assert isinstance(EmbeddedTransport, OffersResultBackend)
    assert default_result_url(EmbeddedTransport, url) == url
    assert default_result_url(RedisTransport, "redis://127.0.0.1:6379/8") == "disabled"
    assert App(broker=url).result_url() == url


# -- refused when it loads -------------------------------------------------------------------------


def test_a_result_backend_missing_methods_is_refused_when_it_loads_naming_each_member(site: FakeSite) -> None:
    site.add("mydb-worker", {"worker.result_backends": {"mydb": "mydb_backend:Backend"}},
             {"mydb_backend": HALF_A_BACKEND})
    manager = PluginManager()
    with pytest.raises(PluginLoadError) as caught:
        manager.slot("result_backend", "mydb")
    message = str(caught.value)
    assert message.startswith(
        "result backend 'mydb' (mydb-worker 1.0, entry point worker.result_backends: mydb = "
        "mydb_backend:Backend) lacks wait_for, forget: every result backend must provide them (see "
        "worker_core.slots.ResultBackend). "
        "wait_for(task_id, timeout=None, interval=0.5): Block until the task is ready"), message
    assert "forget(task_id): Delete a stored result" in message
    assert "store_result" not in message.split("Fix or upgrade")[0].split("(see")[0]
    assert "choose another result backend with the result_backend URL's scheme" in message
    manager.load_all_slots()
    [status] = [s for s in manager.statuses() if s.entry.name == "mydb"]
    assert status.status == "failed" and status.reason is not None
    assert status.reason.startswith("lacks wait_for, forget: every result backend must provide them")


def test_an_app_with_a_backend_missing_methods_fails_before_sending_anything(
    site: FakeSite, tmp_path: Path
) -> None:
    site.add("mydb-worker", {"worker.result_backends": {"mydb": "mydb_backend:Backend"}},
             {"mydb_backend": HALF_A_BACKEND})
    app = App(broker=f"embedded://{tmp_path}/queue.db", backend="mydb://somewhere/0")
    with pytest.raises(PluginLoadError, match=r"lacks wait_for, forget"):
        app.send_task("anything")


def test_workerctl_plugins_shows_a_backend_missing_methods_as_failed_with_the_reason(site: FakeSite) -> None:
    site.add("mydb-worker", {"worker.result_backends": {"mydb": "mydb_backend:Backend"}},
             {"mydb_backend": HALF_A_BACKEND})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site.root), os.environ.get("PYTHONPATH", "")]))
    listing = subprocess.run([sys.executable, "-m", "worker_core", "plugins"], capture_output=True,
                             text=True, env=env, timeout=60)
    assert listing.returncode == 0, listing.stderr
    [row] = [line for line in listing.stdout.splitlines() if line.startswith("mydb ")]
    assert "result_backend" in row and "mydb-worker" in row and " failed " in row
    assert "lacks wait_for, forget: every result backend must provide them" in row
    others = [line for line in listing.stdout.splitlines()[1:] if " failed " in line and line != row]
    assert others == [], "a built-in shows as failed"


def test_a_worker_with_a_backend_missing_methods_refuses_to_start(site: FakeSite, tmp_path: Path) -> None:
    site.add("mydb-worker", {"worker.result_backends": {"mydb": "mydb_backend:Backend"}},
             {"mydb_backend": HALF_A_BACKEND})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site.root), os.environ.get("PYTHONPATH", "")]),
               WORKER_BROKER_URL=f"embedded://{tmp_path}/queue.db", WORKER_RESULT_BACKEND="mydb://host/0")
    steps = subprocess.run([sys.executable, "-m", "worker_core", "steps", "-A", "apps.basic"],
                           capture_output=True, text=True, env=env, timeout=60,
                           cwd=Path(__file__).parent)
    assert steps.returncode == 2, steps.stdout + steps.stderr
    assert "result backend 'mydb' (mydb-worker 1.0" in steps.stderr
    assert "lacks wait_for, forget" in steps.stderr


def test_a_missing_class_attribute_is_named_with_what_the_protocol_says_about_it(site: FakeSite) -> None:
    site.add("odd-pool", {"worker.pools": {"odd": "odd_pool:Pool"}}, {"odd_pool": """
        from worker_core.pools.solo import SoloPool

        class Pool:
            \"\"\"The solo pool's methods, without its class attributes.\"\"\"

        for name, value in vars(SoloPool).items():
            if not name.startswith("_") and name not in ("is_process_pool", "fixed_concurrency"):
                setattr(Pool, name, value)
        """})
    with pytest.raises(PluginLoadError) as caught:
        PluginManager().slot("pool", "odd")
    assert ("lacks is_process_pool: every pool must provide it (see worker_core.slots.Pool). is_process_pool "
            "(a class attribute): Whether jobs run in separate processes") in str(caught.value)


def test_a_capability_offered_by_halves_is_refused(site: FakeSite) -> None:
    site.add("half-shared", {"worker.pools": {"half": "half_pool:Pool"}}, {"half_pool": """
        from worker_core.pools.solo import SoloPool

        class Pool(SoloPool):
            shared_queue = True
        """})
    with pytest.raises(PluginLoadError) as caught:
        PluginManager().slot("pool", "half")
    message = str(caught.value)
    assert ("has shared_queue but lacks withdraw_queued, so it offers only part of "
            "worker_core.slots.SharesOneQueue") in message
    assert "withdraw_queued(): Give back every job not started yet" in message
    assert "Define it too, or remove shared_queue." in message


def test_a_method_replaced_by_something_not_callable_counts_as_missing(site: FakeSite) -> None:
    site.add("flat-loop", {"worker.loops": {"flat": "flat_loop:Loop"}}, {"flat_loop": """
        class Loop:
            uses_hub = False
            run = None
        """})
    with pytest.raises(PluginLoadError, match=r"event loop .flat. .* lacks run: every event loop must"):
        PluginManager().slot("loop", "flat")


def test_a_whole_third_party_implementation_loads(site: FakeSite) -> None:
    site.add("mydb-worker", {"worker.result_backends": {"mydb": "mydb_backend:Backend"}},
             {"mydb_backend": WHOLE_BACKEND})
    manager = PluginManager()
    assert manager.slot("result_backend", "mydb").__module__ == "mydb_backend"
    manager.load_all_slots()
    assert {s.entry.name: s.status for s in manager.statuses()}["mydb"] == "loaded"


# -- URL schemes with "+" --------------------------------------------------------------------------


def test_a_scheme_is_the_whole_part_before_the_colon() -> None:
    assert scheme_of("db+postgresql://user@host/db") == "db+postgresql"
    assert scheme_of("Redis://127.0.0.1") == "redis"


def test_a_scheme_with_a_plus_falls_back_to_its_part_before_the_plus(site: FakeSite, tmp_path: Path) -> None:
    site.add("db-worker", {"worker.result_backends": {"db": "db_backend:Backend"}},
             {"db_backend": WHOLE_BACKEND})
    manager = PluginManager()
    assert manager.slot_entry("result_backend", "db+mysql").name == "db"
    assert manager.slot("result_backend", "db+mysql").__module__ == "db_backend"
    assert manager.slot_entry("transport", "redis+socket").name == "redis"
    app = App(broker=f"embedded://{tmp_path}/queue.db", backend=f"db+sqlite://{tmp_path}/results.db")
    assert type(app.backend).__module__ == "db_backend"


def test_a_scheme_with_a_plus_prefers_the_entry_point_named_after_all_of_it(site: FakeSite) -> None:
    site.add("db-worker", {"worker.result_backends": {"db": "db_backend:Backend",
                                                      "db+oracle": "oracle_backend:Backend"}},
             {"db_backend": WHOLE_BACKEND, "oracle_backend": WHOLE_BACKEND})
    manager = PluginManager()
    assert manager.slot_entry("result_backend", "db+oracle").name == "db+oracle"
    assert manager.slot("result_backend", "db+oracle").__module__ == "oracle_backend"
    assert manager.slot("result_backend", "db+mysql").__module__ == "db_backend"


def test_a_scheme_with_a_plus_that_nothing_serves_names_both_names() -> None:
    with pytest.raises(PluginNotFoundError) as caught:
        PluginManager().slot("result_backend", "db+mysql")
    message = str(caught.value)
    assert "no result_backend named 'db+mysql' or 'db' is installed" in message
    assert "embedded (worker-core)" in message


def test_a_plus_is_not_split_for_slots_chosen_by_name() -> None:
    with pytest.raises(PluginNotFoundError, match="no pool named 'solo\\+fast' is installed"):
        PluginManager().slot("pool", "solo+fast")


def test_the_testing_package_exports_the_four_contract_suites() -> None:
    import worker_core.testing

    assert worker_core.testing.__all__ == ["JobProbe", "PoolRunner", "jobs", "lease_contract",
                                           "pool_contract", "result_backend_contract", "transport_contract"]
