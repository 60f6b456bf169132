"""How long resolving a bootstep graph takes, for 100, 1,000 and 10,000 synthetic steps, and the
same graph through Celery's ``Blueprint`` (``claim_steps`` + ``_finalize_steps``: its resolution
and topological sort, without starting anything) when the ``celery`` package is installed.

    python bench/graph_resolution.py [--sizes 100,1000,10000] [--repeat 5]

Each step requires up to three earlier steps (a random DAG, fixed seed), a tenth are
conditional, and one is last. Prints the best of ``--repeat`` runs per size.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

from worker_core.bootsteps import Condition, Step, resolve
from worker_core.options import WorkerOptions


def synthetic_dag(count: int, seed: int = 7) -> list[tuple[str, list[str]]]:
    rng = random.Random(seed)
    nodes = []
    for index in range(count):
        earlier = {f"s{rng.randrange(index)}" for _ in range(min(index, rng.randint(0, 3)))}
        nodes.append((f"s{index}", sorted(earlier)))
    return nodes


def our_steps(dag: list[tuple[str, list[str]]], seed: int = 7) -> list[Step[Any]]:
    sometimes = Condition("never", lambda options: False)
    steps = [
        Step(name, requires=requires, condition=sometimes if index and index % 10 == 0 else None,
             last=index == len(dag) - 1)
        for index, (name, requires) in enumerate(dag)
    ]
    random.Random(seed).shuffle(steps)
    return steps


def celery_blueprint(dag: list[tuple[str, list[str]]]) -> Any:
    from celery import bootsteps

    classes: dict[str, type] = {}
    for index, (name, requires) in enumerate(dag):
        classes[name] = type(name, (bootsteps.Step,), {
            "name": name, "requires": tuple(classes[r] for r in requires), "last": index == len(dag) - 1,
            "conditional": bool(index and index % 10 == 0), "__module__": __name__,
        })
    return bootsteps.Blueprint(list(classes.values()), name="bench")


def best(runs: int, fn: Any) -> float:
    fastest = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        fastest = min(fastest, time.perf_counter() - started)
    return fastest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    options = WorkerOptions()
    try:
        import celery  # noqa: F401

        with_celery = True
    except ImportError:
        with_celery = False
    print(f"{'steps':>8}  {'worker (ms)':>12}"
          + (f"  {'celery (ms)':>12}  {'ratio':>7}" if with_celery else ""))
    sys.setrecursionlimit(100_000)  # Celery's topological sort recurses along the graph
    for size in (int(s) for s in args.sizes.split(",")):
        dag = synthetic_dag(size)
        steps = our_steps(dag)
        ours = best(args.repeat, lambda steps=steps: resolve("bench", steps, options))
        line = f"{size:>8}  {ours * 1000:>12.2f}"
        if with_celery:
            def theirs_once(dag: list[tuple[str, list[str]]] = dag) -> None:
                blueprint = celery_blueprint(dag)
                blueprint.steps = blueprint.claim_steps()
                blueprint._finalize_steps(blueprint.steps)

            build = best(args.repeat, lambda dag=dag: celery_blueprint(dag))
            theirs = max(best(args.repeat, theirs_once) - build, 0.0)
            line += f"  {theirs * 1000:>12.2f}  {theirs / ours:>6.1f}x"
        print(line)


if __name__ == "__main__":
    main()
