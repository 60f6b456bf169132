"""Calling hooks through pluggy: observers isolated from one another, contributions kept with the
plugin that made them, and the set of hooks someone implements kept current as plugins come and go.

A plugin is registered with pluggy as a proxy holding its hook implementations: each plain
implementation of an observer hook is wrapped so that an error is logged and the next one runs;
each implementation of a contribution hook is wrapped so that an error names the plugin and its
result is attributed to it. pluggy then orders and calls them as it documents (``tryfirst``,
``trylast``, wrappers, ``firstresult``); wrappers are registered as they are.
"""

from __future__ import annotations

import functools
import logging
import threading
import types
from collections.abc import Callable
from typing import Any

import pluggy

from .. import hookspecs
from ..exceptions import ConfigurationError, PluginError

__all__ = ["Hooks"]

logger = logging.getLogger("worker.plugins")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Hooks:
    """The hook side of the plugin manager, over one pluggy ``PluginManager``.

    :param describe: how an error names a plugin (its entry point and distribution).
    """

    def __init__(self, pm: pluggy.PluginManager, describe: Callable[[str], object]) -> None:
        self.pm = pm
        self.describe = describe
        #: names of the hooks some registered plugin implements; updated in place, so holders of
        #: a reference (the worker's per-task fast path) always see the current set
        self.implemented: set[str] = set()
        self._contributions = threading.local()

    # -- registration ----------------------------------------------------------------------------

    def register(self, plugin: object, name: str) -> object:
        """Register ``plugin``'s hook implementations under ``name``; returns the object pluggy
        holds (see :meth:`proxy`). Raises pluggy's errors as they are."""
        proxy = self.proxy(plugin, name)
        self.pm.register(proxy, name=name)
        self._refresh()
        return proxy

    def unregister(self, name: str) -> None:
        if self.pm.has_plugin(name):
            self.pm.unregister(name=name)
            self._refresh()

    def _refresh(self) -> None:
        current = {caller.name for caller in self._callers() if caller.get_hookimpls()}
        self.implemented.intersection_update(current)
        self.implemented.update(current)

    def _callers(self) -> list[Any]:
        return [getattr(self.pm.hook, name) for name in dir(self.pm.hook) if not name.startswith("_")]

    def proxy(self, plugin: object, name: str) -> object:
        """A namespace with ``plugin``'s hook implementations, observers and contributions
        wrapped; attributes that are no hook implementation are left out."""
        found: dict[str, Any] = {}
        for attribute in dir(plugin):
            options = self.pm.parse_hookimpl_opts(plugin, attribute)
            if options is None:
                continue
            function = getattr(plugin, attribute)
            if options.get("wrapper") or options.get("hookwrapper"):
                found[attribute] = function
            elif attribute in hookspecs.OBSERVER_HOOKS:
                found[attribute] = self._isolated(function, name, attribute)
            elif attribute in hookspecs.CONTRIBUTION_HOOKS:
                found[attribute] = self._attributed(function, name, attribute)
            else:
                found[attribute] = function
        return types.SimpleNamespace(**found, __name__=name, __wrapped_plugin__=plugin)

    def _isolated(self, function: Callable[..., Any], plugin: str, hook: str) -> Callable[..., Any]:
        @functools.wraps(function)
        def isolated(*args: Any) -> Any:
            try:
                return function(*args)
            except Exception:
                logger.exception("plugin %s raised in %s; carrying on", plugin, hook)
                return None

        return isolated

    def _attributed(self, function: Callable[..., Any], plugin: str, hook: str) -> Callable[..., Any]:
        def attributed(*args: Any) -> Any:
            try:
                result = function(*args)
            except PluginError:
                raise
            except ConfigurationError as exc:
                raise ConfigurationError(f"{exc} (reported by plugin {self.describe(plugin)})") from exc
            except Exception as exc:
                raise PluginError(
                    f"plugin {self.describe(plugin)} failed in {hook}: {_describe(exc)}"
                ) from exc
            sink = getattr(self._contributions, "sink", None)
            if sink is not None and result is not None:
                sink.append((result, plugin))
            return result

        return functools.update_wrapper(attributed, function)

    # -- calling -------------------------------------------------------------------------------

    def caller(self, hook: str) -> Any:
        """pluggy's hook caller for ``hook`` (call it with keyword arguments)."""
        return getattr(self.pm.hook, hook)

    def notify(self, hook: str, **kwargs: Any) -> None:
        """Call an observer hook, if anyone implements it."""
        if hook in self.implemented:
            getattr(self.pm.hook, hook)(**kwargs)

    def collect(self, hook: str, **kwargs: Any) -> list[tuple[Any, str]]:
        """Call a contribution hook; its results in pluggy's order, each with the name of the
        plugin that returned it (``""`` for a result a wrapper put in)."""
        outer = getattr(self._contributions, "sink", None)
        sink: list[tuple[Any, str]] = []
        self._contributions.sink = sink
        try:
            results = getattr(self.pm.hook, hook)(**kwargs)
        finally:
            self._contributions.sink = outer
        owners = {id(result): plugin for result, plugin in sink}
        return [(result, owners.get(id(result), "")) for result in results or ()]

    def impls(self, hook: str) -> list[pluggy.HookImpl]:
        """The implementations of ``hook``, in registration order."""
        return list(getattr(self.pm.hook, hook).get_hookimpls())
