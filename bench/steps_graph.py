"""Wall time of printing the bootstep graph: ``workerctl steps --graph`` against Celery's
``celery graph bootsteps``, each run as a fresh process (median of ``--repeat`` runs).

    python bench/steps_graph.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

APPS = Path(__file__).resolve().parent / "apps"


def wall(command: list[str], repeat: int) -> float:
    env = dict(os.environ, BENCH_BROKER="redis://127.0.0.1:6379/15", PYTHONPATH=str(APPS))
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(command, cwd=APPS, env=env, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    ours = wall([sys.executable, "-m", "worker_core", "steps", "--graph", "-P", "prefork", "-c", "2"],
                args.repeat)
    theirs = wall([sys.executable, "-m", "celery", "-A", "celery_app", "graph", "bootsteps"], args.repeat)
    print(f"workerctl steps --graph    {ours * 1000:8.1f} ms")
    print(f"celery graph bootsteps     {theirs * 1000:8.1f} ms")
    print(f"ratio                      {theirs / ours:8.2f}x")


if __name__ == "__main__":
    main()
