"""Checking a slot implementation against its slot's Protocol when it loads, without building
it: every required member is there, and no optional capability is offered by halves."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any, Protocol

from ..slots import CAPABILITIES, REQUIRED

__all__ = ["SLOT_WORDS", "capability_problems", "conformance_problem", "describe_member",
           "missing_members", "protocol_members"]

#: Names a Protocol class carries that are not part of the interface it declares.
_NOT_MEMBERS = frozenset(
    {"__init__", "__init_subclass__", "__class_getitem__", "__subclasshook__", "__new__"}
)

#: What the slots are called in sentences.
SLOT_WORDS: Mapping[str, str] = {
    "pool": "pool",
    "transport": "transport",
    "loop": "event loop",
    "autoscaler": "autoscaler",
    "failover": "failover strategy",
    "result_backend": "result backend",
    "app_loader": "app loader",
}


def _declared(base: type) -> list[str]:
    names = list(inspect.get_annotations(base))
    for name, value in vars(base).items():
        if name.startswith("_") and not (_is_dunder(name) and inspect.isfunction(value)):
            continue
        names.append(name)
    return [name for name in names if name not in _NOT_MEMBERS]


def _is_protocol_class(base: type) -> bool:
    # typing marks every class that lists Protocol among its bases (typing.is_protocol from 3.13)
    return bool(getattr(base, "_is_protocol", False)) and base is not Protocol


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def protocol_members(protocol: type, *, own: bool = False) -> tuple[str, ...]:
    """The names ``protocol`` declares (with ``own``, only those of its own body, not those it
    inherits from the Protocols it extends), attributes first."""
    bases = [protocol] if own else [base for base in reversed(protocol.__mro__) if _is_protocol_class(base)]
    found: dict[str, None] = {}
    for base in bases:
        found.update(dict.fromkeys(_declared(base)))
    return tuple(found)


def _raw(protocol: type, name: str) -> Any:
    for base in protocol.__mro__:
        if name in vars(base):
            return vars(base)[name]
    return None


def _is_method(raw: Any) -> bool:
    return inspect.isfunction(raw) or isinstance(raw, (classmethod, staticmethod))


def missing_members(implementation: object, protocol: type) -> list[str]:
    """The members of ``protocol`` that ``implementation`` (a class, read without building it, or
    an instance) lacks: a method must be there and callable, an attribute there at all."""
    missing = []
    for name in protocol_members(protocol):
        try:
            value = getattr(implementation, name)
        except AttributeError:
            missing.append(name)
            continue
        except Exception:  # a property of an instance that raises still exists
            continue
        if _is_method(_raw(protocol, name)) and not callable(value):
            missing.append(name)
    return missing


def _summary(doc: str | None) -> str:
    """The first paragraph of a docstring, on one line, without reStructuredText markup."""
    if not doc:
        return ""
    paragraph = inspect.cleandoc(doc).split("\n\n", 1)[0]
    text = " ".join(paragraph.split())
    text = re.sub(r":(?:class|meth|func|data|mod|attr):`~?([^`]+)`", r"\1", text).replace("``", "")
    return text


def _sentence(text: str) -> str:
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _attribute_comments(protocol: type) -> dict[str, str]:
    """The ``#:`` comments written above the attributes of ``protocol`` and its bases."""
    comments: dict[str, str] = {}
    for base in protocol.__mro__:
        if not _is_protocol_class(base):
            continue
        try:
            lines = inspect.getsource(base).splitlines()
        except (OSError, TypeError):  # no source installed: the member's name and kind still tell
            continue
        pending: list[str] = []
        for line in lines:
            stripped = line.strip()
            if stripped.startswith("#:"):
                pending.append(stripped[2:].strip())
                continue
            declared = re.match(r"(\w+)\s*:", stripped)
            if declared and pending:
                comments.setdefault(declared.group(1), " ".join(pending))
            pending = []
    return comments


def _signature(function: Any, name: str) -> str:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return f"{name}(...)"
    parameters = list(signature.parameters.values())[1:]  # self or cls
    plain = [p.replace(annotation=inspect.Parameter.empty) for p in parameters]
    shown = signature.replace(parameters=plain, return_annotation=inspect.Signature.empty)
    return f"{name}{shown}"


def describe_member(protocol: type, name: str) -> str:
    """What ``protocol`` documents about ``name``: its signature and the first paragraph of its
    docstring, or for an attribute what its ``#:`` comment says."""
    raw = _raw(protocol, name)
    if isinstance(raw, property):
        return f"{name} (a property): {_summary(raw.__doc__)}"
    if _is_method(raw):
        function = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
        kind = "a class method " if isinstance(raw, classmethod) else ""
        return f"{kind}{_signature(function, name)}: {_summary(function.__doc__)}"
    comment = _attribute_comments(protocol).get(name, "")
    return f"{name} (a class attribute){': ' + comment if comment else ''}"


def capability_problems(implementation: object, kind: str) -> list[str]:
    """One sentence per optional capability that ``implementation`` offers only in part."""
    problems = []
    for capability in CAPABILITIES.get(kind, ()):
        own = protocol_members(capability, own=True)
        if not any(hasattr(implementation, name) for name in own):
            continue
        missing = missing_members(implementation, capability)
        if missing:
            having = [name for name in protocol_members(capability) if name not in missing]
            details = " ".join(_sentence(describe_member(capability, name)) for name in missing)
            what = _summary(capability.__doc__).removesuffix(".")
            problems.append(
                f"has {', '.join(having)} but lacks {', '.join(missing)}, so it offers only part of "
                f"{capability.__module__}.{capability.__qualname__} ({what}): "
                f"{details} Define {'them' if len(missing) > 1 else 'it'} too, or remove "
                f"{', '.join(having)}."
            )
    return problems


def conformance_problem(kind: str, implementation: object) -> str | None:
    """Why ``implementation`` cannot serve the ``kind`` slot, or ``None`` when it can."""
    protocol = REQUIRED[kind]
    where = f"{protocol.__module__}.{protocol.__qualname__}"
    missing = missing_members(implementation, protocol)
    problems = []
    if missing:
        details = " ".join(_sentence(describe_member(protocol, name)) for name in missing)
        problems.append(
            f"lacks {', '.join(missing)}: every {SLOT_WORDS[kind]} must provide "
            f"{'them' if len(missing) > 1 else 'it'} (see {where}). {details}"
        )
    problems.extend(capability_problems(implementation, kind))
    if not problems:
        return None
    return problems[0] + "".join(f" It also {problem}" for problem in problems[1:])
