"""The plugin manager: hook plugins registered with pluggy, slot implementations loaded lazily
by name, and one clear message for every way a plugin can be wrong.

One class on purpose: a plugin's entry point, block, load failure and conflict are one record for
hooks and slots, reported together by ``workerctl plugins`` (calling hooks lives in :mod:`.hooks`,
checking slots in :mod:`.conformance`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, overload

import attrs
import pluggy

from .. import hookspecs
from ..bootsteps.graph import Provider
from ..bootsteps.step import Step
from ..exceptions import (
    PluginBlockedError,
    PluginConflictError,
    PluginError,
    PluginLoadError,
    PluginNotFoundError,
)
from ..options import did_you_mean
from ..slots import AppLoader, Autoscaler, EventLoop, FailoverStrategy, Pool, ResultBackend, Transport
from .conformance import SLOT_WORDS, conformance_problem
from .entrypoints import (
    HOOKS_GROUP,
    KNOWN_DISTRIBUTIONS,
    SCHEME_SLOTS,
    SLOT_CHOICE,
    SLOT_GROUPS,
    PluginEntry,
    distribution_of,
    install_hint,
    list_entries,
)
from .hooks import Hooks

__all__ = ["DEFAULT_POOLS", "ESSENTIAL", "PluginManager", "PluginStatus"]

logger = logging.getLogger("worker.plugins")

#: Hook plugins of worker-core the worker cannot run without; ``-p no:`` refuses them.
ESSENTIAL = frozenset({"worker", "consumer"})

#: The pool chosen when ``-P`` is not given: the first of these that is installed and not blocked.
DEFAULT_POOLS = ("prefork", "threads", "solo")


@attrs.define
class PluginStatus:
    """What ``workerctl plugins`` reports about one entry point."""

    entry: PluginEntry
    status: str  # loaded | available | blocked | failed | conflict
    reason: str | None = None
    hooks: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.entry.name,
            "kind": self.entry.kind,
            "group": self.entry.group,
            "target": self.entry.value,
            "distribution": self.entry.distribution,
            "version": self.entry.version,
            "status": self.status,
            "reason": self.reason,
            "hooks": list(self.hooks),
        }


def _describe_error(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class PluginManager:
    """Discovers, blocks, loads and reports plugins.

    :param blocked: names given with ``-p no:NAME``; any entry point with that name, in any group,
        is neither imported nor registered. A mapping gives, for each name, where it was blocked
        (``"WORKER_DISABLE_PLUGINS"``), so messages name the place to undo it.
    :param autoload: register the ``worker.plugins`` entry points at construction.
    """

    def __init__(self, blocked: Iterable[str] | Mapping[str, str] = (), *, autoload: bool = True) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        #: calling hooks through pluggy (observers isolated, contributions attributed)
        self.hooks = Hooks(self._pm, describe=self.provider)
        self._entries: dict[str, list[PluginEntry]] = {}
        self._failed: dict[PluginEntry, str] = {}
        self._loaded_slots: dict[tuple[str, str], object] = {}
        self._registered: dict[str, PluginEntry | None] = {}
        self._blocked_by = {
            name.strip(): (blocked[name] if isinstance(blocked, Mapping) else f"-p no:{name.strip()}")
            for name in blocked if name.strip()
        }
        self.blocked = self._check_blocked(self._blocked_by)
        if autoload:
            self.load_hook_plugins()

    # -- discovery ---------------------------------------------------------------------------

    def entries(self, kind: str) -> list[PluginEntry]:
        """Entry points of one kind (``"hooks"`` or a slot name), without importing them."""
        if kind not in self._entries:
            group = HOOKS_GROUP if kind == "hooks" else SLOT_GROUPS[kind]
            self._entries[kind] = list_entries(group)
        return self._entries[kind]

    def all_entries(self) -> list[PluginEntry]:
        return [e for kind in ("hooks", *SLOT_GROUPS) for e in self.entries(kind)]

    def names(self, kind: str) -> list[str]:
        """Names of one slot's implementations that are installed and not blocked."""
        return sorted({e.name for e in self.entries(kind) if e.name not in self.blocked})

    def blocked_by(self, name: str) -> str:
        """Where ``name`` was blocked: ``-p no:NAME`` or the variable that holds it."""
        return self._blocked_by.get(name, f"-p no:{name}")

    def _check_blocked(self, blocked: Iterable[str]) -> frozenset[str]:
        names = frozenset(blocked)
        essential = names & ESSENTIAL
        if essential:
            name = sorted(essential)[0]
            raise PluginBlockedError(
                f"plugin {name!r} cannot be blocked: it is essential to worker-core "
                f"(essential plugins: {', '.join(sorted(ESSENTIAL))}); remove it from {self.blocked_by(name)}"
            )
        if names:
            known = {e.name for e in self.all_entries()}
            for name in sorted(names - known):
                raise PluginNotFoundError(
                    f"{self.blocked_by(name)} blocks nothing: no installed plugin is named {name!r}."
                    f"{did_you_mean(name, known)} Run `workerctl plugins` to see the installed ones."
                )
        return names

    # -- hook plugins ------------------------------------------------------------------------

    @property
    def hook(self) -> Any:
        return self._pm.hook

    def load_hook_plugins(self) -> None:
        """Import and register every ``worker.plugins`` entry point that is not blocked.

        Essential core plugins go first, the rest by name. A plugin that fails to import or to
        register is recorded (see :meth:`failures`) and skipped; the others still load. Two
        entry points with one name are a conflict: neither is registered, and
        :meth:`require_plugin` reports both distributions.
        """
        entries = self.entries("hooks")
        by_name: dict[str, list[PluginEntry]] = {}
        for entry in entries:
            by_name.setdefault(entry.name, []).append(entry)
        ordered = sorted(by_name, key=lambda name: (name not in ESSENTIAL, name))
        for name in ordered:
            group = by_name[name]
            if name in self.blocked or self._pm.has_plugin(name):
                continue
            if len(group) > 1:
                reason = self._conflict_text("hooks", name, group)
                for entry in group:
                    self._failed[entry] = reason
                continue
            self._load_hook_entry(group[0])
        for name in ESSENTIAL:
            if name not in self._registered:
                self.require_plugin(name)

    def _load_hook_entry(self, entry: PluginEntry) -> None:
        try:
            plugin = entry.load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit at import time is a broken plugin too
            self._failed[entry] = f"failed to import: {_describe_error(exc)}"
            logger.debug("plugin %s failed to import", entry.describe(), exc_info=True)
            return
        try:
            self.register(plugin, entry.name, entry=entry)
        except PluginError as exc:
            self._failed[entry] = str(exc)

    def register(self, plugin: object, name: str, *, entry: PluginEntry | None = None) -> None:
        """Register a hook plugin object: an entry point's, one app code registers
        (``app.register_hooks``), or one a plugin adds while the worker runs."""
        try:
            registered = self.hooks.register(plugin, name)
        except pluggy.PluginValidationError as exc:
            raise PluginLoadError(f"failed to register: {exc}") from None
        except ValueError as exc:
            raise PluginConflictError(f"plugin name {name!r} is already registered: {exc}") from None
        unknown = [
            caller.name
            for caller in self._pm.get_hookcallers(registered) or ()
            if not caller.has_spec()
        ]
        if unknown:
            self.hooks.unregister(name)
            hook = unknown[0]
            known = [n for n in dir(hookspecs) if n.startswith(("worker_", "task_", "before_", "after_"))]
            raise PluginLoadError(
                f"implements hook {hook!r}, which does not exist.{did_you_mean(hook, known)} "
                f"Hooks are listed in worker_core.hookspecs"
            )
        self._registered[name] = entry

    def unregister(self, name: str) -> None:
        """Take a registered hook plugin out (its hooks are no longer called)."""
        self.hooks.unregister(name)
        self._registered.pop(name, None)

    def has_plugin(self, name: str) -> bool:
        return self._pm.has_plugin(name)

    def require_plugin(self, name: str) -> None:
        """Raise the clear error for a hook plugin the command cannot do without."""
        if name in self._registered:
            return
        failed = [(e, r) for e, r in self._failed.items() if e.kind == "hooks" and e.name == name]
        if failed:
            entry, reason = failed[0]
            if "provided by more than one" in reason:
                raise PluginConflictError(reason)
            raise PluginLoadError(f"plugin {entry.describe()} {reason}")
        raise PluginNotFoundError(
            f"plugin {name!r} is not installed; it comes with worker-core: reinstall it with "
            f"`pip install --force-reinstall ./core` (from a checkout of this repository)"
        )

    def provider(self, plugin_name: str) -> Provider:
        entry = self._registered.get(plugin_name)
        if entry is None:
            return Provider(plugin=plugin_name)
        return Provider(plugin=plugin_name, lookup=functools.partial(distribution_of, entry))

    def hooks_of(self, plugin_name: str) -> tuple[str, ...]:
        plugin = self._pm.get_plugin(plugin_name)
        if plugin is None:
            return ()
        return tuple(sorted(caller.name for caller in self._pm.get_hookcallers(plugin) or ()))

    def impls(self, hook_name: str) -> list[pluggy.HookImpl]:
        """Implementations of a hook in registration order (core plugins first)."""
        return self.hooks.impls(hook_name)

    def collect(self, hook_name: str, **kwargs: Any) -> list[tuple[Any, Provider]]:
        """Call a contribution hook through pluggy, keeping who returned what.

        An error inside a plugin propagates as :class:`PluginError` naming the plugin (a
        ``ConfigurationError`` stays one, with the plugin named).
        """
        return [(result, self.provider(name)) for result, name in self.hooks.collect(hook_name, **kwargs)]

    def bootsteps(self, blueprint: str) -> tuple[list[Step[Any]], list[Provider]]:
        """Every step contributed to a blueprint, with the plugin that contributed it."""
        steps: list[Step[Any]] = []
        providers: list[Provider] = []
        for result, provider in self.collect("worker_bootsteps", blueprint=blueprint):
            if result is None:
                continue
            if isinstance(result, Step) or not isinstance(result, Sequence):
                raise PluginError(
                    f"plugin {provider} returned {result!r} from worker_bootsteps; it must return a "
                    f"list of Step instances"
                )
            for step in result:
                if not isinstance(step, Step):
                    hint = " (a class: instantiate it)" if isinstance(step, type) else ""
                    raise PluginError(
                        f"plugin {provider} returned {step!r} from worker_bootsteps{hint}; "
                        f"every item must be a worker_core.Step instance"
                    )
                steps.append(step)
                providers.append(provider)
        return steps, providers

    def notify(self, hook_name: str, **kwargs: Any) -> None:
        """Call an observer hook through pluggy; an error in one plugin is logged and the others
        still run."""
        self.hooks.notify(hook_name, **kwargs)

    # -- slots ---------------------------------------------------------------------------------

    @overload
    def slot(self, kind: Literal["pool"], name: str) -> type[Pool]: ...
    @overload
    def slot(self, kind: Literal["transport"], name: str) -> type[Transport]: ...
    @overload
    def slot(self, kind: Literal["loop"], name: str) -> type[EventLoop]: ...
    @overload
    def slot(self, kind: Literal["autoscaler"], name: str) -> type[Autoscaler]: ...
    @overload
    def slot(self, kind: Literal["failover"], name: str) -> type[FailoverStrategy]: ...
    @overload
    def slot(self, kind: Literal["result_backend"], name: str) -> type[ResultBackend]: ...
    @overload
    def slot(self, kind: Literal["app_loader"], name: str) -> type[AppLoader]: ...
    @overload
    def slot(self, kind: str, name: str) -> object: ...

    def slot(self, kind: str, name: str) -> Any:
        """Import and return the implementation of ``kind`` named ``name`` (only that one),
        checked against the slot's Protocol (:data:`worker_core.slots.REQUIRED`) without building
        it. For transports and result backends, ``name`` is a URL scheme: see :meth:`slot_entry`.

        :raise PluginNotFoundError: nothing provides it (the message lists what does, and what to
            install).
        :raise PluginBlockedError: it was blocked with ``-p no:NAME``.
        :raise PluginConflictError: two distributions provide it.
        :raise PluginLoadError: its module failed to import, or what it names lacks a member the
            slot requires (or offers an optional capability only in part).
        """
        key = (kind, name)
        if key in self._loaded_slots:
            return self._loaded_slots[key]
        entry = self.slot_entry(kind, name)
        try:
            implementation = entry.load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            reason = f"failed to import: {_describe_error(exc)}"
            self._failed[entry] = reason
            raise PluginLoadError(
                f"{kind} {entry.describe()} {reason}. Fix or reinstall "
                f"{entry.distribution or 'its distribution'}, or choose another {kind} with "
                f"{SLOT_CHOICE[kind]}"
            ) from None
        problem = conformance_problem(kind, implementation)
        if problem is not None:
            self._failed[entry] = problem
            raise PluginLoadError(
                f"{SLOT_WORDS[kind]} {entry.describe()} {problem} Fix or upgrade "
                f"{entry.distribution or 'its distribution'}, or choose another {SLOT_WORDS[kind]} with "
                f"{SLOT_CHOICE[kind]}"
            )
        self._loaded_slots[key] = self._loaded_slots[(kind, entry.name)] = implementation
        return implementation

    def slot_entry(self, kind: str, name: str) -> PluginEntry:
        """The one entry point providing ``name`` for ``kind``, checked but not imported.

        A transport or result backend scheme with ``+`` (``db+postgresql``) is served by the entry
        point named after the whole scheme, else by the one named after its part before ``+``
        (``db``).
        """
        matches = [e for e in self.entries(kind) if e.name == name]
        if not matches and kind in SCHEME_SLOTS and "+" in name:
            matches = [e for e in self.entries(kind) if e.name == name.partition("+")[0]]
        if not matches:
            raise PluginNotFoundError(self._not_found_text(kind, name))
        found = matches[0].name
        if found in self.blocked:
            others = [n for n in self.names(kind) if n != found]
            instead = f"; available: {', '.join(others)}" if others else ""
            raise PluginBlockedError(
                f"{kind} {matches[0].describe()} is blocked by {self.blocked_by(found)}; remove it there "
                f"or choose another {kind} with {SLOT_CHOICE[kind]}{instead}"
            )
        if len(matches) > 1:
            raise PluginConflictError(self._conflict_text(kind, found, matches))
        return matches[0]

    def _not_found_text(self, kind: str, name: str) -> str:
        available = self.names(kind)
        listing = ", ".join(f"{n} ({self._dist_of(kind, n)})" for n in available) or "none"
        tried = [name]
        if kind in SCHEME_SLOTS and "+" in name:
            tried.append(name.partition("+")[0])
        asked = " or ".join(repr(n) for n in tried)
        text = f"no {kind} named {asked} is installed. Available: {listing}."
        text += did_you_mean(tried[-1], available)
        known = next((KNOWN_DISTRIBUTIONS[kind, n] for n in tried if (kind, n) in KNOWN_DISTRIBUTIONS), None)
        if known:
            text += f" Install it with: {install_hint(known)}"
        else:
            text += f" Install the distribution that provides it, or choose one with {SLOT_CHOICE[kind]}."
        return text

    def _dist_of(self, kind: str, name: str) -> str:
        dists = {e.distribution or "unknown distribution" for e in self.entries(kind) if e.name == name}
        return " and ".join(sorted(dists))

    def _conflict_text(self, kind: str, name: str, entries: Sequence[PluginEntry]) -> str:
        what = "plugin" if kind == "hooks" else kind
        providers = " and ".join(
            f"{e.distribution or 'an unknown distribution'} ({e.group}: {e.name} = {e.value})"
            for e in entries
        )
        dists = [e.distribution for e in entries if e.distribution]
        fix = f"uninstall one of them (pip uninstall {dists[-1]})" if dists else "uninstall one of them"
        if kind != "hooks":
            others = [n for n in self.names(kind) if n != name]
            if others:
                fix += f", or choose another {kind} with {SLOT_CHOICE[kind]} ({', '.join(others)})"
        return f"{what} {name!r} is provided by more than one distribution: {providers}; {fix}"

    def load_all_slots(self) -> None:
        """Try to import every slot implementation (for ``workerctl plugins``); failures are
        recorded, not raised."""
        for kind in SLOT_GROUPS:
            for name in {e.name for e in self.entries(kind)}:
                if name in self.blocked:
                    continue
                try:
                    self.slot(kind, name)
                except PluginError as exc:
                    for entry in self.entries(kind):
                        if entry.name == name and entry not in self._failed:
                            self._failed[entry] = str(exc)

    def default_pool(self) -> str:
        available = self.names("pool")
        for name in DEFAULT_POOLS:
            if name in available:
                return name
        if available:
            return available[0]
        raise PluginNotFoundError(
            "no pool is installed; worker-core provides 'solo': reinstall it with "
            "`pip install --force-reinstall ./core`, or install the prefork pool: pip install "
            "./plugins/pool_prefork (from a checkout of this repository)"
        )

    # -- reporting -----------------------------------------------------------------------------

    def failures(self) -> list[str]:
        """One line per plugin that failed to load, for a warning before a command runs."""
        lines = []
        for entry, reason in self._failed.items():
            if "provided by more than one" in reason:
                lines.append(reason)
            else:
                lines.append(
                    f"{'plugin' if entry.kind == 'hooks' else entry.kind} {entry.describe()} {reason}"
                )
        return sorted(set(lines))

    def statuses(self) -> list[PluginStatus]:
        """The status of every discovered entry point, hook plugins first."""
        result = []
        for entry in self.all_entries():
            if entry.name in self.blocked:
                result.append(PluginStatus(entry, "blocked", f"blocked by {self.blocked_by(entry.name)}"))
            elif entry in self._failed:
                reason = self._failed[entry]
                status = "conflict" if "provided by more than one" in reason else "failed"
                result.append(PluginStatus(entry, status, reason))
            elif entry.kind == "hooks":
                if self._registered.get(entry.name) == entry:
                    result.append(PluginStatus(entry, "loaded", hooks=self.hooks_of(entry.name)))
                else:
                    result.append(PluginStatus(entry, "available"))
            elif (entry.kind, entry.name) in self._loaded_slots:
                result.append(PluginStatus(entry, "loaded"))
            else:
                result.append(PluginStatus(entry, "available"))
        return result

    def registered_names(self) -> Mapping[str, PluginEntry | None]:
        return dict(self._registered)
