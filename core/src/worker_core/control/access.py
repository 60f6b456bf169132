"""Which remote-control commands a worker answers: ``worker_remote_control_allow`` checked against
the commands it has, groups expanded, and the answer for a command it refuses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from ..exceptions import ConfigurationError, PluginConflictError, PluginError
from ..options import did_you_mean
from .command import ControlCommand as Command
from .commands import BUILTIN_COMMANDS

if TYPE_CHECKING:
    from ..plugins.manager import PluginManager

__all__ = ["GROUPS", "Access", "all_commands", "check_allow_list"]

SETTING = "worker_remote_control_allow"
#: names that stand for every command of a kind
GROUPS: Mapping[str, str] = {
    "inspect": "every read-only command",
    "control": "every command that changes the worker",
}


@attrs.frozen
class Access:
    """The commands allowed (every one when ``allow`` is None)."""

    allow: tuple[str, ...] | None
    allowed: frozenset[str]

    @classmethod
    def from_setting(cls, allow: Sequence[str] | None, commands: Mapping[str, Command]) -> Access:
        """Expand ``allow`` over ``commands``; a name that is neither a command nor a group is an
        error listing the known ones (a typo would otherwise lock out a command silently)."""
        if allow is None:
            return cls(None, frozenset(commands))
        unknown = [name for name in allow if name not in commands and name not in GROUPS]
        if unknown:
            hints = "".join(did_you_mean(name, [*commands, *GROUPS]) for name in unknown)
            groups = ", ".join(f"{group!r} ({meaning})" for group, meaning in GROUPS.items())
            raise ConfigurationError(
                f"setting {SETTING!r} names no command called {', '.join(map(repr, unknown))} "
                f"(got {list(allow)!r}).{hints} The commands are {', '.join(sorted(commands))}; the groups "
                f"are {groups}. Correct the name, or leave the setting None to answer every command"
            )
        allowed: set[str] = set()
        for name in allow:
            if name in GROUPS:
                allowed.update(known for known, command in commands.items() if command.kind == name)
            else:
                allowed.add(name)
        return cls(tuple(allow), frozenset(allowed))

    def permits(self, name: str) -> bool:
        return name in self.allowed

    def summary(self) -> str:
        """The setting's value as the start-up line shows it."""
        return "every command" if self.allow is None else "only " + ", ".join(self.allow)

    def refusal(self, command: Command) -> str:
        """The error a refused command answers: what was refused, by which setting, the fix."""
        allow = ", ".join(self.allow or ())
        return (f"remote control command {command.name!r} is not allowed on this worker: {SETTING} "
                f"allows only {allow}; add {command.name!r} (or {command.kind!r}) to it on the worker "
                f"to allow it")


def all_commands(plugins: PluginManager) -> dict[str, Command]:
    """The built-in commands plus those plugins contribute (a name clash is an error)."""
    commands: dict[str, Command] = dict(BUILTIN_COMMANDS)
    owners: dict[str, object] = {name: "worker-core" for name in commands}  # (shown only in errors)
    for contributed, provider in plugins.collect("worker_control_commands"):
        if isinstance(contributed, (list, tuple)):
            if not all(isinstance(command, Command) for command in contributed):
                raise PluginError(f"plugin {provider} returned {contributed!r} from "
                                  f"worker_control_commands; it must return ControlCommand instances, or a "
                                  f"mapping of names to handlers")
            contributed = {command.name: command for command in contributed}
        for name, handler in (contributed or {}).items():
            if name in GROUPS:
                raise PluginConflictError(
                    f"plugin {provider} contributed a control command named {name!r}, which "
                    f"{SETTING} uses for {GROUPS[name]}; rename the command"
                )
            if name in commands:
                raise PluginConflictError(
                    f"control command {name!r} is provided by {owners[name]} and by plugin {provider}; "
                    f"rename one of them"
                )
            if isinstance(handler, Command):
                if handler.name != name:
                    raise PluginError(f"plugin {provider} contributed control command {handler.name!r} under "
                                      f"the name {name!r}; use one name")
                commands[name] = handler
            elif callable(handler):
                commands[name] = Command(name, handler, kind="control")
            else:
                raise PluginError(
                    f"plugin {provider} contributed control command {name!r} that is not callable"
                )
            owners[name] = provider
    return commands


def check_allow_list(plugins: PluginManager, allow: Sequence[str] | None) -> None:
    """Refuse, before the worker starts, an allow-list naming a command nobody provides."""
    if allow is not None:
        Access.from_setting(allow, all_commands(plugins))
