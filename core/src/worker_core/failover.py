"""Failover strategies: which broker URL to try next when several are configured.

``round-robin`` and ``shuffle`` behave as kombu's strategies of the same names; ``priority``
always prefers the first URL and moves back to it once it answers again.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from .exceptions import ConfigurationError

if TYPE_CHECKING:
    from .slots import FailoverStrategy

__all__ = ["Priority", "RoundRobin", "Shuffle"]


class _Strategy:
    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ConfigurationError("a failover strategy needs at least one broker URL")
        self.urls = list(urls)

    def first(self) -> str:
        return self.urls[0]

    def next(self, failed: str) -> str:
        raise NotImplementedError

    def preferred(self, current: str) -> str | None:
        return None

    def __iter__(self) -> Iterator[str]:
        url = self.first()
        while True:
            yield url
            url = self.next(url)


class RoundRobin(_Strategy):
    """Try the URLs in the order given, wrapping around."""

    def next(self, failed: str) -> str:
        try:
            position = self.urls.index(failed)
        except ValueError:
            return self.urls[0]
        return self.urls[(position + 1) % len(self.urls)]


class Shuffle(_Strategy):
    """Try the URLs in a random order, never the one that just failed when there is another."""

    def __init__(self, urls: Sequence[str], rng: random.Random | None = None) -> None:
        super().__init__(urls)
        self._rng = rng or random.Random()

    def first(self) -> str:
        return self._rng.choice(self.urls)

    def next(self, failed: str) -> str:
        others = [url for url in self.urls if url != failed] or self.urls
        return self._rng.choice(others)


class Priority(RoundRobin):
    """Prefer the first URL: fail over in order, and move back to the first one as soon as it
    answers again (the consumer asks :meth:`preferred` periodically while on another URL)."""

    def preferred(self, current: str) -> str | None:
        return self.urls[0] if current != self.urls[0] else None


if TYPE_CHECKING:
    # mypy proves the classes satisfy their slot's Protocol.
    _ROUND_ROBIN: type[FailoverStrategy] = RoundRobin
    _SHUFFLE: type[FailoverStrategy] = Shuffle
    _PRIORITY: type[FailoverStrategy] = Priority
