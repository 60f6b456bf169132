"""The periodic-task scheduler: how long a takeover takes, and what a scheduler costs in CPU per
entry with 10,000 entries, beside Celery's beat.

    python bench/beat.py --broker redis://127.0.0.1:6379/15 [--takeovers 5] [--entries 10000]
    python bench/beat.py --broker amqp://guest:guest@127.0.0.1:5672// --takeovers 5 --entries 0

**Takeover**: three ``workerctl beat`` processes share a 0.25 s entry; the leader is killed
(SIGKILL), or paused (SIGSTOP) and resumed once another took over, ``--takeovers`` times each; the
figure is the time from the fault to the first tick the new leader sends (the ticks missed in
between are sent then, late, once).

**CPU per entry**: one scheduler with ``--entries`` entries every ``--interval`` seconds (10: 1,000
ticks a second asked for) runs ``--seconds`` after its first round of ticks; the figure is its CPU
time (user + system, from /proc) divided by the ticks it sent; and with as many entries that never
come due (a yearly crontab), after ``--warmup`` seconds, its CPU per second of keeping them.
Celery's beat (``celery beat``, its PersistentScheduler, one process, nothing to hand over)
runs the same schedule when celery is installed. Both send to a queue nobody reads, emptied at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

QUEUE = "bench-beat"
LEADS = re.compile(r"beat: (\S+) sends the periodic tasks now")


def app_module(folder: Path, entries: int, interval: float, kind: str) -> str:
    """A module ``beatbench`` of this project's App (``kind="ours"``) or a Celery app."""
    schedule = ("crontab(0, 0, day_of_month=1, month_of_year=1)" if interval == 0 else repr(interval))
    if kind == "ours":
        head = ("from worker_core import App\nfrom worker_beat import crontab\n"
                "app = App('beatbench', broker=os.environ['BENCH_BROKER'], result_backend='disabled')\n")
    else:
        head = ("from celery import Celery\nfrom celery.schedules import crontab\n"
                "app = Celery('beatbench', broker=os.environ['BENCH_BROKER'])\n")
    (folder / "beatbench.py").write_text(textwrap.dedent(f"""\
        import os
        {head.replace(chr(10), chr(10) + '        ')}
        app.conf.beat_schedule = {{
            f"e{{n}}": {{"task": "beatbench.noop", "schedule": {schedule}, "options": {{"queue": "{QUEUE}"}}}}
            for n in range({entries})
        }}
        """))
    return "beatbench"


def queue_length(broker: str) -> int:
    from kombu.connection import Connection

    with Connection(broker) as connection:
        try:
            return int(connection.default_channel.queue_declare(QUEUE, passive=True).message_count)
        except Exception:
            return 0


def purge(broker: str) -> None:
    from kombu.connection import Connection

    with Connection(broker) as connection:
        try:
            connection.default_channel.queue_purge(QUEUE)
        except Exception:
            pass


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(command: list[str], folder: Path, broker: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(folder), BENCH_BROKER=broker, CELERY_BROKER_URL=broker,
               PYTHONUNBUFFERED="1")
    return subprocess.Popen(command, cwd=folder, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def ours(folder: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "worker_core", "beat", "-A", "beatbench", "-n", name, "-l", "INFO", *extra]


def takeovers(broker: str, count: int) -> dict[str, list[float]]:
    arrivals: list[float] = []
    found: dict[str, list[float]] = {"SIGKILL": [], "SIGSTOP": []}
    with tempfile.TemporaryDirectory() as where:
        folder = Path(where)
        app_module(folder, 1, 0.25, "ours")
        processes: dict[str, subprocess.Popen[bytes]] = {}
        logs: dict[str, Path] = {}

        def launch(name: str) -> None:
            logs[name] = folder / f"{name}.log"
            processes[name] = start(ours(folder, name), folder, broker, logs[name])

        def leader() -> str:
            best, when = "", -1.0
            for name, log in logs.items():
                text = log.read_text(errors="replace")
                for match in LEADS.finditer(text):
                    if name in match.group(1):
                        line_start = text.rfind("\n", 0, match.start()) + 1
                        written = text[line_start + 1:line_start + 20]
                        stamp = time.mktime(time.strptime(written, "%Y-%m-%d %H:%M:%S"))
                        if stamp >= when:
                            best, when = name, stamp
            return best

        try:
            for n in range(3):
                launch(f"s{n}@bench")
            _measure_takeovers(broker, count, processes, logs, launch, leader, arrivals, found)
        finally:
            for process in processes.values():
                process.send_signal(signal.SIGCONT)
                process.terminate()
            for process in processes.values():
                process.wait(30)
    purge(broker)
    return found


def _measure_takeovers(broker: str, count: int, processes: dict[str, Any], logs: dict[str, Path], launch: Any,
                       leader: Any, arrivals: list[float], found: dict[str, list[float]]) -> None:
    from kombu.connection import Connection
    from kombu.entity import Exchange, Queue
    from kombu.messaging import Consumer

    if True:
        queue = Queue(QUEUE, Exchange(QUEUE), QUEUE)
        serial = 3
        def arrived(body: Any, message: Any) -> None:
            arrivals.append(time.time())
            message.ack()

        with Connection(broker) as connection, \
                Consumer(connection, [queue], accept=["json"], callbacks=[arrived]):
            def drain(seconds: float) -> None:
                end = time.time() + seconds
                while time.time() < end:
                    try:
                        connection.drain_events(timeout=0.05)
                    except TimeoutError:
                        pass

            drain(8)
            for fault in ("SIGKILL", "SIGSTOP"):
                for _ in range(count):
                    name = leader()
                    drain(1)
                    process = processes[name]
                    faulted = time.time()
                    process.send_signal(getattr(signal, fault))
                    before = len(arrivals)
                    while len(arrivals) == before or arrivals[-1] <= faulted + 0.26:
                        drain(0.05)
                        if time.time() - faulted > 30:
                            raise RuntimeError(f"no tick within 30 s of the {fault}")
                    found[fault].append(arrivals[-1] - faulted)
                    if fault == "SIGSTOP":
                        process.send_signal(signal.SIGCONT)
                        drain(2)
                    else:
                        process.wait()
                        del processes[name], logs[name]
                        launch(f"s{serial}@bench")
                        serial += 1
                        drain(4)


def cpu_per_tick(broker: str, entries: int, interval: float, seconds: float, kind: str,
                 warmup: float = 40.0) -> tuple[float, int]:
    """``(CPU seconds per tick, ticks)``, or for interval 0 ``(CPU seconds per second, 0)``."""
    purge(broker)
    with tempfile.TemporaryDirectory() as where:
        folder = Path(where)
        app_module(folder, entries, interval, kind)
        command = (ours(folder, "cpu@bench") if kind == "ours" else
                   ["celery", "-A", "beatbench", "beat", "-s", str(folder / "schedule"), "-l", "INFO",
                    "--max-interval", "1"])
        if kind == "celery":
            command[0] = str(Path(sys.executable).parent / "celery")
        process = start(command, folder, broker, folder / "scheduler.log")
        try:
            deadline = time.time() + 120
            if interval:
                while queue_length(broker) < entries and time.time() < deadline:
                    time.sleep(0.2)  # the first round of ticks: start-up over
            else:
                time.sleep(warmup)  # start-up, reading the entries, their first look (measured apart)
            cpu, sent = cpu_seconds(process.pid), queue_length(broker)
            time.sleep(seconds)
            cpu, sent = cpu_seconds(process.pid) - cpu, queue_length(broker) - sent
        finally:
            process.terminate()
            process.wait(60)
    purge(broker)
    return (cpu / sent if sent else 0.0, sent) if interval else (cpu / seconds, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--takeovers", type=int, default=5)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=40.0,
                        help="Seconds a scheduler of entries never due runs before it is measured.")
    parser.add_argument("--only", choices=("ours", "celery"), help="Measure one scheduler's CPU only.")
    args = parser.parse_args()
    if args.takeovers:
        for fault, times in takeovers(args.broker, args.takeovers).items():
            print(f"takeover after {fault}: median {statistics.median(times):.2f} s, max {max(times):.2f} s "
                  f"({len(times)} runs: {', '.join(f'{t:.2f}' for t in times)})")
    if args.entries:
        kinds = ["ours"]
        try:
            import celery  # noqa: F401
            kinds.append("celery")
        except ImportError:
            pass
        for kind in kinds if args.only is None else [args.only]:
            per_tick, ticks = cpu_per_tick(args.broker, args.entries, args.interval, args.seconds, kind)
            idle, _ = cpu_per_tick(args.broker, args.entries, 0, args.seconds, kind, args.warmup)
            who = "this scheduler" if kind == "ours" else "celery beat"
            print(f"{who}, {args.entries} entries every {args.interval:g} s: {per_tick * 1e6:.0f} µs of CPU "
                  f"per tick ({ticks} ticks in {args.seconds:g} s); {args.entries} entries never due: "
                  f"{idle * 1e3:.1f} ms of CPU per second ({idle / args.entries * 1e9:.0f} ns per entry)")


if __name__ == "__main__":
    main()
