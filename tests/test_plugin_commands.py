"""What plugins contribute beyond steps and options: ``workerctl`` commands (``workerctl_commands``),
gauges in the worker's metrics (``worker_gauges``), and a task published on a producer of the
caller's (``send_task(producer=...)``, what a scheduler sending under a lease uses)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner
from conftest import FakeSite
from kombu.connection import Connection
from kombu.messaging import Producer

from worker_core import App
from worker_core.cli.group import main
from worker_core.hookspecs import Gauge, hookimpl
from worker_core.plugins.manager import PluginManager

GREETER = """
import click
from worker_core import hookimpl

@click.command()
@click.argument("who")
def hello(who):
    '''Say hello.'''
    click.echo(f"hello {who}")

@hookimpl
def workerctl_commands():
    return {"hello": hello}
"""

CLASHING = """
import click
from worker_core import hookimpl

@hookimpl
def workerctl_commands():
    return {"worker": click.Command("worker")}
"""


def test_a_plugins_command_runs_under_workerctl_and_is_listed(site: FakeSite) -> None:
    site.add("greeter", {"worker.plugins": {"greeter": "greeter_plugin"}}, {"greeter_plugin": GREETER})
    result = CliRunner().invoke(main, ["hello", "you"], catch_exceptions=False)
    assert (result.exit_code, result.stdout) == (0, "hello you\n")
    listed = CliRunner().invoke(main, ["--help"], catch_exceptions=False)
    assert "hello" in listed.stdout and "Say hello." in listed.stdout


def test_a_blocked_plugins_command_is_not_there(site: FakeSite) -> None:
    site.add("greeter", {"worker.plugins": {"greeter": "greeter_plugin"}}, {"greeter_plugin": GREETER})
    result = CliRunner().invoke(main, ["hello", "you"], env={"WORKER_DISABLE_PLUGINS": "greeter"})
    assert result.exit_code == 2 and "No such command 'hello'" in result.stderr


def test_a_plugin_command_named_as_a_built_in_one_is_refused_naming_both(site: FakeSite) -> None:
    site.add("clash", {"worker.plugins": {"clash": "clash_plugin"}}, {"clash_plugin": CLASHING})
    result = CliRunner().invoke(main, ["nothing-here"])
    assert result.exit_code == 2
    assert "the workerctl command 'worker' is provided by worker-core and by plugin clash" in result.stderr


class _Worker:
    """What the metrics' plugin gauges read: the worker's plugins."""

    def __init__(self, plugins: PluginManager) -> None:
        self.plugins = plugins
        self.hostname = "w1@host"


def test_gauges_plugins_contribute_are_served_with_the_hostname_label() -> None:
    from worker_metrics_prometheus.metrics import plugin_gauges

    class Leader:
        @hookimpl
        def worker_gauges(self, worker: Any) -> list[Gauge]:
            return [Gauge("worker_beat_leader", "1 while this worker leads.", 1.0),
                    Gauge("worker_beat_entry_due", "Seconds to the next run.", 5.0, {"entry": "a"}),
                    Gauge("worker_beat_entry_due", "Seconds to the next run.", 7.0, {"entry": "b"})]

    class Broken:
        @hookimpl
        def worker_gauges(self, worker: Any) -> list[Gauge]:
            raise RuntimeError("no")

    plugins = PluginManager(autoload=False)
    plugins.register(Leader(), "leader")
    labelled = plugin_gauges(_Worker(plugins), ("hostname",), ("w1@host",))
    families = {family.name: family for family in labelled}
    leader = families["worker_beat_leader"].samples
    assert [(sample.labels, sample.value) for sample in leader] == [({"hostname": "w1@host"}, 1.0)]
    assert [(s.labels, s.value) for s in families["worker_beat_entry_due"].samples] == [
        ({"hostname": "w1@host", "entry": "a"}, 5.0), ({"hostname": "w1@host", "entry": "b"}, 7.0)]
    plugins.register(Broken(), "broken")
    # logged, left out of this reading
    assert list(plugin_gauges(_Worker(plugins), ("hostname",), ("w1@host",))) == []


def test_a_task_sent_on_a_producer_of_the_callers_goes_through_it(tmp_path: Path) -> None:
    url = f"embedded://{tmp_path}/queue.db"
    app = App("producer", broker=url, result_backend="disabled")
    published: list[str] = []

    class Watching(Producer):  # type: ignore[misc]
        def publish(self, body: Any, **options: Any) -> Any:
            published.append(options["routing_key"])
            return super().publish(body, **options)

    from worker_core.transports.embedded import EmbeddedTransport

    transport = EmbeddedTransport(url, app.settings)
    options = transport.connection_options()
    with Connection(url, transport=transport.kombu_transport(), **options) as connection:
        result = app.send_task("proj.add", (2, 3), producer=Watching(connection), queue="beat-q", priority=3)
        assert published == ["beat-q"]
        message = connection.SimpleQueue("beat-q").get(timeout=5)
        assert message.headers["id"] == result.id and message.headers["task"] == "proj.add"
        assert message.properties["priority"] == 3
        message.ack()
