"""How long resolving a bootstep graph takes, for 100, 1,000 and 10,000 synthetic steps.

    python bench/graph_resolution.py [--sizes 100,1000,10000] [--repeat 5]

Each step requires up to three earlier steps (a random DAG, fixed seed), a tenth are
conditional, and one is last. Prints the best of ``--repeat`` runs per size.
"""

from __future__ import annotations

import argparse
import random
import time

from worker_core.bootsteps import Condition, Step, resolve
from worker_core.options import WorkerOptions


def synthetic_steps(count: int, seed: int = 7) -> list[Step]:
    rng = random.Random(seed)
    sometimes = Condition("never", lambda options: False)
    steps = []
    for index in range(count):
        earlier = [f"s{rng.randrange(index)}" for _ in range(min(index, rng.randint(0, 3)))]
        steps.append(
            Step(
                f"s{index}",
                requires=sorted(set(earlier)),
                condition=sometimes if index and index % 10 == 0 else None,
                last=index == count - 1,
            )
        )
    rng.shuffle(steps)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    options = WorkerOptions()
    print(f"{'steps':>8}  {'best (ms)':>10}  {'enabled':>8}")
    for size in (int(s) for s in args.sizes.split(",")):
        steps = synthetic_steps(size)
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            graph = resolve("bench", steps, options)
            best = min(best, time.perf_counter() - started)
        print(f"{size:>8}  {best * 1000:>10.2f}  {len(graph.order):>8}")


if __name__ == "__main__":
    main()
