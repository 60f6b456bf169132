"""Soak: many ``acks_late`` tasks through a real broker while pool children are killed, workers are
killed and restarted (at once, or a few seconds after a SIGTERM), and the broker connection is cut;
some tasks may run longer than Redis's visibility timeout, some wait for a countdown longer than
it. Then prove nothing was lost and explain every task that ran more than once.

    python bench/soak.py --broker both --tasks 100000 [-P prefork] [-c 2] [--interval 0.5,3]
                         [--cut 0.2,3] [--seed N] [--keep] [--workers 2]
                         [--faults child-kill,worker-kill,connection-cut,term-kill] [--grace 3]
                         [--visibility-timeout 20] [--long 0.01] [--long-seconds S] [--countdowns 0.05]
                         [--pause 7.5,15]

Each broker gets a private redis-server (the Redis broker and the ledger) and a TCP proxy between
the worker and the broker; RabbitMQ is the shared server, with a queue of the run's own that is
deleted afterwards. The task (``bench/apps/soak_app.py``) appends one line per execution to the
ledger. Faults ``pause`` (SIGSTOP a worker and its processes for --pause seconds, by default 1.5
to 3 visibility timeouts) and ``clock-step`` (step a worker's wall clock an hour or ten minutes
either way, or back: libfaketime, Debian's ``faketime``) are among them on request. The run lasts
until every task has run (not a fixed duration), then waits for redeliveries to settle, stops the
worker warmly and prints a table. Exit status 0 when nothing
was lost, every duplicate is explained, and the worker never crashed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]  # chaos/, and faults.py / workers.py

from chaos.injector import KINDS  # noqa: E402
from chaos.report import details, table  # noqa: E402
from chaos.run import Outcome, SoakOptions, soak  # noqa: E402


def _pair(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    try:
        pair = (float(low), float(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be MIN,MAX seconds, for example 0.5,3 (got {text!r})") \
            from None
    if not 0 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"must be MIN,MAX with 0 <= MIN <= MAX (got {text!r})")
    return pair


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(kind.strip() for kind in text.split(",") if kind.strip())
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"must be one or more of {', '.join(KINDS)}, comma-separated "
                                          f"(got {text!r})")
    return kinds


def _share(text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0 <= share <= 1:
        raise argparse.ArgumentTypeError(f"must be a share between 0 and 1, as 0.01 (got {text!r})")
    return share


def parse(argv: list[str] | None = None) -> tuple[list[str], SoakOptions]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--broker", choices=("redis", "amqp", "both"), default="both")
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("-P", "--pool", default="prefork")
    parser.add_argument("-c", "--concurrency", type=int, default=2)
    parser.add_argument("--interval", type=_pair, default=(0.5, 3.0), help="seconds between faults: MIN,MAX")
    parser.add_argument("--cut", type=_pair, default=(0.2, 3.0), help="length of a connection cut: MIN,MAX")
    parser.add_argument("--stall-timeout", type=float, default=180.0,
                        help="give up when no task ran for this long")
    parser.add_argument("--seed", type=int, help="random seed (printed, to repeat a run)")
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--keep", action="store_true", help="keep the logs of clean runs too")
    parser.add_argument("--loglevel", default="WARNING", help="the worker's log level (INFO logs every task)")
    parser.add_argument("--workers", type=int, default=1, help="workers at once, each killed on its own")
    parser.add_argument("--faults", type=_kinds, default=("child-kill", "worker-kill", "connection-cut"),
                        help=f"the faults to inject, comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--grace", type=float, default=3.0,
                        help="term-kill: seconds between the SIGTERM and the SIGKILL")
    parser.add_argument("--visibility-timeout", type=float, default=20.0, help="Redis's, in seconds")
    parser.add_argument("--long", type=_share, default=0.0,
                        help="share of the tasks that run --long-seconds (0 to 1)")
    parser.add_argument("--long-seconds", type=float,
                        help="how long a long task runs (default: twice the visibility timeout)")
    parser.add_argument("--countdowns", type=_share, default=0.0,
                        help="share of the tasks sent with a countdown of 1.2 to 2 visibility timeouts")
    parser.add_argument("--pause", type=_pair, help="pause: how long a worker is stopped, MIN,MAX seconds")
    args = parser.parse_args(argv)
    if args.tasks < 1:
        parser.error("--tasks must be at least 1")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    brokers = ["redis", "amqp"] if args.broker == "both" else [args.broker]
    return brokers, SoakOptions(tasks=args.tasks, pool=args.pool, concurrency=args.concurrency,
                                interval=args.interval, cut_length=args.cut, stall_timeout=args.stall_timeout,
                                seed=args.seed, amqp_url=args.amqp_url, keep=args.keep,
                                loglevel=args.loglevel, workers=args.workers, faults=args.faults,
                                grace=args.grace, visibility_timeout=args.visibility_timeout,
                                long_share=args.long, long_seconds=args.long_seconds,
                                countdown_share=args.countdowns, pause_length=args.pause)


def main(argv: list[str] | None = None) -> int:
    brokers, options = parse(argv)
    outcomes: list[Outcome] = []
    for kind in brokers:
        started = time.monotonic()
        print(f"soak on {kind}: {options.tasks} tasks, {options.workers} worker(s) -P {options.pool} "
              f"-c {options.concurrency}, faults {', '.join(options.faults)}", file=sys.stderr)
        outcomes.append(soak(kind, options))
        print(f"soak on {kind}: done in {time.monotonic() - started:.0f}s", file=sys.stderr)
    print(table(outcomes))
    for outcome in outcomes:
        text = details(outcome)
        if text:
            print(text)
    return 0 if all(outcome.clean for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
