"""Scale out on a RabbitMQ cluster: three nodes of this machine's own (own names and ports, never
the shared server), workers on a quorum queue, and the node leading the queue killed mid-run.
Nothing may be lost, and the workers must move on by themselves.

    python bench/cluster_failover.py [--tasks 5000] [--workers 2] [-c 4] [--task-ms 10] [--keep]

Tasks are sent (with publisher confirms) before the workers start; each run of a task is counted
in a Redis hash of its own (a private redis-server); once a third has run, the Erlang VM of the
leading node is killed (SIGKILL). Prints the tasks sent, run, lost and run twice (acks_late
redeliveries of the tasks that were running), the seconds from the kill until the first task
taken afterwards finished, and whether every worker is still running. Exit 0 when nothing was
lost and no worker died.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests")]

from rabbit_cluster import RabbitCluster, failover_run  # noqa: E402
from tls_servers import free_ports  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-c", "--concurrency", type=int, default=4)
    parser.add_argument("--task-ms", type=float, default=10.0)
    parser.add_argument("--keep", action="store_true", help="keep the nodes' and workers' logs")
    options = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="cluster-failover-"))
    (port,) = free_ports(1)
    redis_server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                     "--appendonly", "no"], stdout=subprocess.DEVNULL)
    cluster = RabbitCluster(directory)
    try:
        cluster.start()
        outcome = failover_run(cluster, directory, f"redis://127.0.0.1:{port}/0", tasks=options.tasks,
                               worker_count=options.workers, concurrency=options.concurrency,
                               task_seconds=options.task_ms / 1000)
    finally:
        cluster.stop()
        redis_server.terminate()
        redis_server.wait(timeout=30)
        if not options.keep:
            shutil.rmtree(directory, ignore_errors=True)
    print(f"tasks sent          {outcome.tasks}")
    print(f"tasks run           {outcome.done}")
    print(f"lost                {outcome.lost}")
    print(f"run twice           {outcome.duplicates}")
    print(f"node killed         {outcome.killed} (the queue's leader)")
    print(f"fleet pause         {outcome.recovery_seconds:.1f} s from the kill until the next task was done")
    moved = ", ".join(f"{seconds:.1f} s" for seconds in outcome.reconnect_seconds) or "none lost its node"
    print(f"moved on            {moved} (a worker on the killed node: until it had done a task through "
          f"another node)")
    print(f"total               {outcome.total_seconds:.1f} s")
    print(f"workers alive       {outcome.workers_alive} of {outcome.workers}")
    if options.keep:
        print(f"logs in             {directory}")
    moved_on = all(seconds != float("inf") for seconds in outcome.reconnect_seconds)
    return 0 if outcome.lost == 0 and outcome.workers_alive == outcome.workers and moved_on else 1


if __name__ == "__main__":
    sys.exit(main())
