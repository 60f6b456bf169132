"""The asyncio pool's hook implementations: its command-line options.

- ``--asyncio-processes N``: loop processes (default 1), each with its own event loop and its
  share of ``-c``, to use N cores.
- ``--asyncio-threads N``: threads per process for plain (not ``async def``) functions
  (default: the process's share of ``-c``, at most 16).
- ``--asyncio-io-threads N``: threads per process that store results and run the rest of the
  synchronous work around each ``async def`` task, off the loop (default 4).
- ``--asyncio-loop auto|uvloop|asyncio``: the event loop (``auto``: uvloop when installed).
- ``--asyncio-stall-after SECONDS``: log a loop that does not turn for that long (0.5; 0: off).
- ``--asyncio-cancel-grace SECONDS``: how long a cancelled coroutine may take to end before its
  process is replaced (2).
"""

from __future__ import annotations

from collections.abc import Callable

from worker_core import OptionSpec, hookimpl

__all__ = ["LOOPS", "worker_options"]

LOOPS = ("auto", "uvloop", "asyncio")


def _loop(text: str) -> str:
    value = text.strip().lower()
    if value not in LOOPS:
        raise ValueError(f"must be auto, uvloop or asyncio (got {text!r})")
    return value


def _number(kind: type, *, zero: bool) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(
                f"must be {'an integer' if kind is int else 'a number'} (got {text!r})"
            ) from None
        if value < 0 or (value == 0 and not zero):
            raise ValueError(f"must be {'>= 0' if zero else '> 0'} (got {text!r})")
        return value  # type: ignore[no-any-return]

    return convert


@hookimpl
def worker_options() -> list[OptionSpec]:
    return [
        OptionSpec(
            "asyncio_processes",
            ("--asyncio-processes",),
            convert=_number(int, zero=False),
            default=1,
            help="asyncio pool: loop processes, each with its own event loop and share of -c (default 1).",
        ),
        OptionSpec(
            "asyncio_threads",
            ("--asyncio-threads",),
            convert=_number(int, zero=False),
            default=None,
            help="asyncio pool: threads per process for plain functions (default: its share of -c, "
            "at most 16).",
        ),
        OptionSpec(
            "asyncio_io_threads",
            ("--asyncio-io-threads",),
            convert=_number(int, zero=False),
            default=4,
            help="asyncio pool: threads per process that store the results of async def tasks (and "
            "run the hooks and sends around them) off the loop (default 4).",
        ),
        OptionSpec(
            "asyncio_loop",
            ("--asyncio-loop",),
            convert=_loop,
            default="auto",
            help="asyncio pool: auto (uvloop when installed), uvloop or asyncio.",
        ),
        OptionSpec(
            "asyncio_stall_after",
            ("--asyncio-stall-after",),
            convert=_number(float, zero=True),
            default=0.5,
            help="asyncio pool: log a loop blocked for this many seconds (0: off).",
        ),
        OptionSpec(
            "asyncio_cancel_grace",
            ("--asyncio-cancel-grace",),
            convert=_number(float, zero=False),
            default=2.0,
            help="asyncio pool: seconds a cancelled coroutine may take to end before its "
            "process is replaced.",
        ),
    ]
