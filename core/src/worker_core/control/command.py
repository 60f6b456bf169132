"""What a remote-control command is: its name, its handler, its kind (``inspect`` reads,
``control`` changes), its help and its typed arguments, as Celery declares its own (``args=[("n",
int)]``). Built-in commands and those plugins contribute are the same class, so ``workerctl
inspect NAME ARGS`` / ``workerctl control NAME ARGS`` parse and send both alike."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

__all__ = ["KINDS", "ArgumentError", "ControlCommand"]

#: the kinds of command: ``inspect`` only reads the worker's state, ``control`` changes it
KINDS = ("inspect", "control")

_WHAT = {int: "a whole number", float: "a number", str: "a text"}


class ArgumentError(ValueError):
    """A word of the command line that its argument's type does not take."""

    def __init__(self, argument: str, why: str) -> None:
        super().__init__(f"{argument} {why}")
        self.argument = argument
        self.why = why


Argument = tuple[str, Callable[[str], Any]]


def _as_args(value: Iterable[Argument]) -> tuple[Argument, ...]:
    return tuple(value)


def _check_args(_command: Any, _attribute: Any, value: Any) -> None:
    for item in value:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and item[0]
                and callable(item[1])):
            raise TypeError(f"args must be (name, type) pairs such as ('n', int) (got {item!r})")


@attrs.frozen
class ControlCommand:
    """A remote-control command.

    ``handler(worker, **arguments)`` runs in the worker's event-loop thread and returns a
    JSON-able reply: by convention ``{"ok": text}`` or ``{"error": text}`` for a command that
    changes the worker, the data itself for one that reads it. It must accept (and may ignore)
    arguments it does not know, as clients of other versions send them (``**_extra``).

    On the command line the words after the command's name are its arguments: each of ``args``
    (a name and the type its word is converted with: ``int``, ``float``, ``str`` or any function
    of one text), then, with ``variadic``, every remaining word as a list under that name;
    ``required`` is how many words must be given.
    """

    name: str
    handler: Callable[..., Any] = attrs.field(eq=False)
    kind: str = attrs.field(default="inspect", validator=attrs.validators.in_(KINDS))
    help: str = ""
    args: tuple[tuple[str, Callable[[str], Any]], ...] = attrs.field(
        default=(), converter=_as_args, validator=_check_args, eq=False)
    variadic: str = ""
    required: int = 0
    #: what the command line shows for the arguments (``[N=1]``); made from ``args`` when empty
    signature: str = ""
    #: left out of the command lists (Celery's ``hello``, which workers send each other)
    hidden: bool = False

    @property
    def usage(self) -> str:
        """The arguments as the command line takes them: ``TASK_NAME RATE``, ``[N]``, ``ID...``."""
        if self.signature:
            return self.signature
        words = [name.upper() for name, _type in self.args]
        if self.variadic:
            words.append(f"{self.variadic.upper()}...")
        return " ".join(word if index < self.required else f"[{word}]" for index, word in enumerate(words))

    def parse(self, words: Sequence[str]) -> dict[str, Any]:
        """The arguments of the command from the words given on a command line.

        :raise ValueError: too few or too many words, or one its type does not take (the
            message names the argument).
        """
        got = f"got {len(words)} argument{'s' if len(words) != 1 else ''}"
        if len(words) < self.required or (len(words) > len(self.args) and not self.variadic):
            raise ValueError(f"{self.name} takes {self.usage or 'no arguments'} ({got})")
        values: dict[str, Any] = {}
        for (name, kind), word in zip(self.args, words, strict=False):
            try:
                values[name] = kind(word)
            except (TypeError, ValueError) as exc:
                what = _WHAT.get(kind) if isinstance(kind, type) else None
                why = f"must be {what}" if what else str(exc)
                raise ArgumentError(name.upper(), f"{why} (got {word!r})") from None
        if self.variadic and len(words) > len(self.args):
            values[self.variadic] = list(words[len(self.args):])
        return values
