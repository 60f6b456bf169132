"""The embedded transport on a full disk (a small tmpfs of the test's own, filled to the last
byte): the worker backs off as from a lost broker, each line names the file and what to do,
nothing is lost, dumped or run twice, and the write-ahead log stays small."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps import basic
from workers import TESTS, WorkerProcess, wait_for

from worker_core.transports.embedded.disk import WAL_LIMIT

# Short back-off, so a test sees several attempts; the default starts at 2 s and grows to 30 s.
BACKOFF = json.dumps({"interval_start": 1, "interval_step": 1, "interval_max": 1})


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB file system of the test's own (a tmpfs; mounting one needs root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        why = f"cannot mount a small tmpfs to fill: {mounted.stderr.strip()} (needs root)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk has no byte left; delete it to free the space again."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def cpu_seconds(pid: int) -> float:
    """User and system time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def left_in(database: Path, queue: str = "celery") -> int:
    """Messages of ``queue`` still in the file, ready or reserved."""
    with sqlite3.connect(database) as db:
        return int(db.execute("SELECT COUNT(*) FROM messages WHERE queue = ?", (queue,)).fetchone()[0])


@pytest.fixture
def start_worker(workers, small_disk: Path, tmp_path: Path):
    broker = f"embedded://{small_disk}/queue.db"
    basic.app.conf.update(broker_url=broker, result_backend=None)
    dumps = tmp_path / "tmp"  # kombu writes its emergency dumps to the temporary directory
    dumps.mkdir()

    def start(*args: str, ready: bool = True) -> WorkerProcess:
        return workers.start(*args, pool="threads", broker=broker, ready=ready,
                             env={"PYTHONPATH": str(TESTS), "WORKER_RESULT_BACKEND": "disabled",
                                  "WORKER_BROKER_TRANSPORT_OPTIONS": BACKOFF, "TMPDIR": str(dumps)})

    yield start
    basic.app.close()
    assert list(dumps.iterdir()) == [], "something was dumped"


def assert_nothing_dumped_or_claimed(log: str) -> None:
    for line in ("EMERGENCY DUMP", "UNABLE TO RESTORE", "Restoring", "Traceback"):
        assert line not in log, line


def test_a_full_disk_makes_the_worker_back_off_naming_the_file_and_nothing_is_lost(
        start_worker, small_disk: Path, tmp_path: Path) -> None:
    proof, database = tmp_path / "ran.txt", small_disk / "queue.db"
    worker = start_worker("-c", "2")
    for n in range(60):
        basic.pause_then_record.delay(str(proof), n, 0.05)
    wait_for(lambda: len(basic.lines(proof)) >= 6, message="the first tasks to run")

    # A reader keeps the log from starting over (sqlite reuses its file once every reader has
    # moved past it): each write must then grow the file, as on a disk that fills for good.
    reader = sqlite3.connect(database, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM messages").fetchone()
    filler = fill(small_disk)
    worker.wait_log("Cannot connect to", timeout=15)
    # A window of back-off: a few attempts, each one line naming the file, and an idle process.
    log, cpu, started = worker.log(), cpu_seconds(worker.pid), time.monotonic()
    time.sleep(4)  # the behaviour under test: what 4 s of back-off look like
    window = worker.log()[len(log):].splitlines()
    cpu, elapsed = cpu_seconds(worker.pid) - cpu, time.monotonic() - started
    attempts = [line for line in window if "Cannot connect to" in line]
    assert 1 <= len(attempts) <= 4, window
    assert all(f"'{database}' is on a full disk" in line and "free space there" in line
               for line in attempts), attempts
    # Nothing else but the attempt and its "Trying again in" line, and the outcomes of the tasks
    # that ran when the disk filled: the loop reports them between two attempts.
    others = [line for line in window if "Cannot connect to" not in line
              and not line.startswith("Trying again in") and " succeeded in " not in line]
    assert others == [], window
    assert len([line for line in window if " succeeded in " in line]) <= 2, window  # -c 2
    assert cpu < 0.1 * elapsed, f"{cpu:.2f}s of CPU in {elapsed:.1f}s of back-off"
    assert len(basic.lines(proof)) < 60, "the disk filled too late to test anything"

    filler.unlink()
    reader.execute("COMMIT")
    reader.close()
    wait_for(lambda: left_in(database) == 0 and len(basic.lines(proof)) >= 60, timeout=20,
             message="every task to run")
    assert worker.stop() == 0  # and finish what it runs: a second run would show now
    runs = Counter(basic.lines(proof))
    assert set(runs) == {str(n) for n in range(60)}
    assert [value for value, count in runs.items() if count > 1] == []
    log = worker.log()
    assert_nothing_dumped_or_claimed(log)
    assert "can be written again" in log


def test_a_worker_started_on_a_full_disk_waits_for_room_then_runs_what_was_queued(
        start_worker, small_disk: Path, tmp_path: Path) -> None:
    proof, database = tmp_path / "ran.txt", small_disk / "queue.db"
    for n in range(20):
        basic.record.delay(str(proof), n)
    basic.app.close()  # the last connection out checkpoints the log into the file
    filler = fill(small_disk)

    worker = start_worker(ready=False)
    worker.wait_log("Cannot connect to", timeout=15)
    assert f"'{database}'" in worker.log() and "free space there" in worker.log()
    assert basic.lines(proof) == []

    filler.unlink()
    wait_for(lambda: left_in(database) == 0 and len(basic.lines(proof)) >= 20, timeout=20,
             message="every task to run")
    assert worker.stop() == 0
    assert sorted(basic.lines(proof), key=int) == [str(n) for n in range(20)]
    assert_nothing_dumped_or_claimed(worker.log())


def test_the_write_ahead_log_stays_small_under_load(workers, tmp_path: Path) -> None:
    database = tmp_path / "queue.db"
    broker = f"embedded://{database}"
    basic.app.conf.update(broker_url=broker, result_backend=broker)
    wal, peak, done = Path(f"{database}-wal"), 0, threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, wal.stat().st_size if wal.exists() else 0)
            time.sleep(0.01)  # the sampling period of the measurement

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        workers.start("-c", "2", pool="threads", broker=broker, backend=broker,
                      env={"PYTHONPATH": str(TESTS)})
        results = [basic.add.delay(n, n) for n in range(6000)]
        assert [result.get(timeout=60) for result in results[-10:]] == [2 * n for n in range(5990, 6000)]
        wait_for(lambda: left_in(database) == 0, timeout=30, message="every task to be acknowledged")
    finally:
        done.set()
        watcher.join()
        basic.app.close()
    # It grew to 5.6-18 MB here before (sqlite's own checkpoints, file never cut back).
    assert peak <= WAL_LIMIT + WAL_LIMIT // 4, f"the -wal file grew to {peak:,} bytes"
