"""Fast paths built on library internals: each is checked before its first use, and one whose
check fails is turned off, with one line in the log, so the library's own path runs instead.

A fast path is checked against the library versions it was tested with and against every name
it relies on (the name exists, a method's signature is the one expected, the library's own code
still uses the attributes the fast path sets or reads). ``WORKER_STOCK_KOMBU=1`` turns every fast
path off: the stock paths, for testing them.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from types import CodeType, ModuleType
from typing import Any

import attrs

__all__ = ["STOCK_VARIABLE", "Check", "Decision", "FastPath", "FastPaths", "Library", "attribute", "decide",
           "reads", "report", "signature"]

#: the environment variable that turns every fast path off
STOCK_VARIABLE = "WORKER_STOCK_KOMBU"


@attrs.frozen
class Check:
    """Something a fast path relies on: ``owner.name`` (``owner`` a class or module of the
    library), looked at by ``problem(owner, name)``, which says what changed (None: nothing)."""

    owner: Any
    name: str
    problem: Callable[[Any, str], str | None]

    def __call__(self) -> str | None:
        return self.problem(self.owner, self.name)


@attrs.frozen
class Library:
    """A library and the versions its internals were checked against: ``low`` up to, not
    including, ``below`` (the same bounds as the distribution's pins)."""

    module: ModuleType
    name: str
    low: tuple[int, ...]
    below: tuple[int, ...]

    @property
    def version(self) -> str:
        return str(getattr(self.module, "__version__", "?"))

    def checked(self) -> str:
        return f"{self.name}>={_dotted(self.low)},<{_dotted(self.below)}"

    def check(self) -> str | None:
        found = _padded(tuple(int(part) for part in re.findall(r"\d+", self.version)[:3]))
        if found and _padded(self.low) <= found < _padded(self.below):
            return None
        return f"{self.name} {self.version} is not among the versions checked ({self.checked()})"


@attrs.frozen
class FastPath:
    """A faster way to do something a library does, and what runs when it is off."""

    #: what it is, for the log ("the batched fetch")
    name: str
    #: what runs instead ("messages are taken one BRPOP at a time")
    stock: str
    libraries: Sequence[Library]
    checks: Sequence[Check]
    #: the fast paths it works with (off when any of them is)
    needs: Sequence[str] = ()
    #: what the user keeps when it is off
    still: str = "delivery still works, more slowly"


@attrs.frozen
class Decision:
    """Which fast paths are on; why each other one is off (what changed in its library), or
    which fast path it went off with (one it works only with)."""

    on: frozenset[str]
    off: Mapping[str, str] = attrs.field(factory=dict)
    off_with: Mapping[str, str] = attrs.field(factory=dict)
    stock: bool = False

    def __contains__(self, name: object) -> bool:
        return name in self.on


def decide(paths: Mapping[str, FastPath], environ: Mapping[str, str]) -> Decision:
    """Run every check (cheap: no I/O) and decide; ``paths`` in order of their ``needs``."""
    if environ.get(STOCK_VARIABLE, "") not in ("", "0"):
        return Decision(frozenset(), {name: f"{STOCK_VARIABLE}=1" for name in paths}, stock=True)
    on: set[str] = set()
    off: dict[str, str] = {}
    off_with: dict[str, str] = {}
    for key, path in paths.items():
        problems = [problem for library in path.libraries if (problem := library.check())]
        if not problems:
            problems = [problem for check in path.checks if (problem := check())]
        missing = [need for need in path.needs if need not in on]
        if problems:
            off[key] = "; ".join(problems)
        elif missing:
            off_with[key] = missing[0]
        else:
            on.add(key)
    return Decision(frozenset(on), off, off_with)


def report(decision: Decision, paths: Mapping[str, FastPath], what: str, logger: logging.Logger) -> None:
    """Say once what is off and why (``what``: "Redis transport"): one line per reason, naming
    the fast paths that went off with the ones it concerns."""
    if decision.stock:
        logger.info("%s: %s=1: every fast path is off (%s); the libraries' own paths are used", what,
                    STOCK_VARIABLE, ", ".join(path.name for path in paths.values()))
        return
    groups: dict[str, list[str]] = {}
    for key, why in decision.off.items():
        groups.setdefault(why, []).append(key)
    for why, keys in groups.items():
        for key in paths:  # paths are in order of their needs: a chain of them is followed
            root = decision.off_with.get(key)
            if root in keys and key not in keys:
                keys.append(key)
        chosen = [paths[key] for key in keys]
        names = chosen[0].name if len(chosen) == 1 else (
            ", ".join(path.name for path in chosen[:-1]) + " and " + chosen[-1].name)
        libraries = {library.checked(): None for path in chosen for library in path.libraries}
        logger.warning("%s: %s %s off, because %s. Instead %s; %s (checked with %s)", what, names,
                       "is" if len(chosen) == 1 else "are", why, "; ".join(path.stock for path in chosen),
                       chosen[0].still, ", ".join(libraries))


class FastPaths:
    """A transport's fast paths, decided at the first :meth:`current` and said once in the log."""

    def __init__(self, paths: Mapping[str, FastPath], what: str, logger: logging.Logger) -> None:
        self.paths, self.what, self.logger = paths, what, logger
        self._decision: Decision | None = None

    def current(self) -> Decision:
        """Which fast paths are on in this process."""
        if self._decision is None:
            self._decision = decide(self.paths, os.environ)
            report(self._decision, self.paths, self.what, self.logger)
        return self._decision

    def forget(self) -> None:
        """Decide again at the next :meth:`current` (after the environment or a library changed)."""
        self._decision = None


# -- checks -----------------------------------------------------------------------------------------


def _padded(version: tuple[int, ...]) -> tuple[int, ...]:
    return (*version, *(0,) * (3 - len(version))) if version else ()


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def _where(owner: Any) -> str:
    """``owner`` named with its library's version: "kombu 5.7.0's Channel"."""
    dotted = owner.__name__ if isinstance(owner, ModuleType) else owner.__module__
    library = dotted.partition(".")[0]
    version = getattr(__import__(library), "__version__", "?")
    return f"{library} {version}'s {getattr(owner, '__qualname__', dotted)}"


def attribute(owner: Any, name: str) -> Check:
    """``owner`` still has ``name``."""
    return Check(owner, name, _attribute_problem)


def signature(owner: Any, name: str, expected: str) -> Check:
    """``owner.name`` is a callable whose signature reads exactly ``expected`` ("(self, x=None)")."""
    return Check(owner, name, functools.partial(_signature_problem, expected=expected))


def reads(owner: Any, name: str, *names: str) -> Check:
    """``owner.name`` (a function, property or context manager) still uses the attributes
    ``names``: the library's own code works the way the fast path copies or feeds."""
    return Check(owner, name, functools.partial(_reads_problem, names=names))


def _attribute_problem(owner: Any, name: str) -> str | None:
    return None if hasattr(owner, name) else f"{_where(owner)} has no {name}"


def _signature_problem(owner: Any, name: str, expected: str) -> str | None:
    function = getattr(owner, name, None)
    if function is None:
        return f"{_where(owner)} has no {name}"
    try:
        found = str(inspect.signature(function))
    except (TypeError, ValueError):
        found = "an unknown signature"
    return None if found == expected else f"{_where(owner)}.{name} takes {found}, not {expected}"


def _reads_problem(owner: Any, name: str, names: Sequence[str]) -> str | None:
    # on a class, the descriptor itself (a property's getter, not its value)
    found = (inspect.getattr_static(owner, name, None) if isinstance(owner, type)
             else getattr(owner, name, None))
    if found is None:
        return f"{_where(owner)} has no {name}"
    code = _code(found)
    if code is None:
        return f"{_where(owner)}.{name} is not Python code that can be checked"
    gone = [each for each in names if each not in _names(code)]
    return f"{_where(owner)}.{name} does not use {', '.join(gone)}" if gone else None


def _code(function: Any) -> CodeType | None:
    for attr in ("fget", "func", "__func__"):  # property, cached_property, classmethod
        function = getattr(function, attr, function)
    function = inspect.unwrap(function) if callable(function) else function
    code = getattr(function, "__code__", None)
    return code if isinstance(code, CodeType) else None


def _names(code: CodeType) -> set[str]:
    """Every global and attribute name ``code`` and the functions nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _names(const)
    return names
