"""Node names and the ``%`` placeholders of names and paths, expanded as Celery expands them.

``-n w1@%h`` names the worker ``w1@<this host>``; a name without ``@`` is a host, so ``-n w1``
is ``celery@w1`` and no ``-n`` is ``celery@<this host>``. Paths (``--pidfile``, ``--logfile``,
``--statedb``) are expanded for the node: ``%n`` its name before ``@``, ``%h`` its host, ``%d``
that host's domain, ``%p`` the whole node name, ``%i`` the process index (0 in the main
process) and ``%I`` the same as ``-N`` (nothing in the main process); ``%%`` is a percent sign.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping

from .exceptions import ConfigurationError

__all__ = ["DEFAULT_NAME", "default_nodename", "host_format", "node_format", "nodesplit"]

#: the name half of a node name that gives only a host (Celery's)
DEFAULT_NAME = "celery"

_PLACEHOLDER = re.compile(r"%([%\w])")

Expansion = str | Callable[[], str]

#: what each placeholder stands for, for the error naming an unknown one
_MEANINGS = {"h": "host name", "n": "node or host short name", "d": "domain", "p": "node name",
             "i": "process index", "I": "-index, empty in the main process", "N": "node short name"}


def nodesplit(nodename: str) -> tuple[str | None, str]:
    """``("w1", "host")`` for ``w1@host``; ``(None, "host")`` for a name without ``@``."""
    name, at, host = nodename.partition("@")
    return (name, host) if at else (None, name)


def default_nodename(value: str | None) -> str:
    """The node name ``-n value`` gives before expansion: ``celery@<host>`` without a value,
    ``celery@value`` for a value without ``@``."""
    name, host = nodesplit(value or "")
    return f"{name or DEFAULT_NAME}@{host or socket.gethostname()}"


def _expand(text: str, keys: Mapping[str, Expansion], what: str) -> str:
    def resolve(match: re.Match[str]) -> str:
        key = match.group(1)
        if key == "%":
            return "%"
        found = keys.get(key)
        if found is None:
            known = ", ".join(f"%{k} ({_MEANINGS[k]})" if k in _MEANINGS else f"%{k}" for k in keys)
            raise ConfigurationError(
                f"{what} {text!r} has an unknown placeholder '%{key}'; use {known} or %% (a percent sign)"
            )
        return found() if callable(found) else found

    return _PLACEHOLDER.sub(resolve, text)


def host_format(text: str, host: str | None = None, name: str | None = None, *, what: str = "--hostname",
                index: int | None = None, **extra: Expansion) -> str:
    """Expand ``%h`` (``host``, this machine's name by default), ``%n`` (``name``, else the
    host's first label), ``%d`` (the host's domain), ``%i`` and ``%I`` (the process index, see
    :func:`node_format`) and any ``extra`` one-letter keys in ``text``. ``what`` names the
    option in the error for an unknown placeholder."""
    host = host or socket.gethostname()
    first, _, domain = host.partition(".")
    keys: dict[str, Expansion] = {
        "h": host, "n": name or first, "d": domain,
        "i": str(index or 0), "I": f"-{index}" if index else "",
    }
    keys.update(extra)
    return _expand(text, keys, what)


def node_format(text: str, nodename: str, *, what: str = "path", index: int | None = None,
                **extra: Expansion) -> str:
    """Expand a path for the node ``nodename`` (``w1@host``): ``%n`` is ``w1``, ``%h`` is
    ``host``, ``%d`` its domain, ``%p`` the whole name, ``%i`` the process ``index`` (0, the
    main process, when None) and ``%I`` ``-<index>`` (empty in the main process)."""
    name, host = nodesplit(nodename)
    return host_format(text, host, name or DEFAULT_NAME, what=what, index=index, p=nodename, **extra)
