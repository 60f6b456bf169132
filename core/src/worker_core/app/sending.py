"""The options ``send_task`` takes beyond its plain ones: canvas (links, chain, chord, a place in
a group), what a signature may carry from Celery's client (stamps, publish retries), those that
mean nothing here, and a clear refusal of the rest. Plain tasks never come here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from .base import App

__all__ = ["CANVAS_OPTIONS", "IGNORED_OPTIONS", "PLAIN", "Extra", "as_list", "extra_options"]

#: What ``send_task(**options)`` takes, as Celery's client does: ``link``, ``link_error``
#: (a signature or a list of them), ``chain`` (signatures, last first), ``chord`` (the body of
#: the chord whose header the task is part of), ``group_index``, ``headers`` (added to the
#: message's headers), ``reply_to``, ``route_name`` (route as that task would be),
#: ``argsrepr``/``kwargsrepr``, ``stamped_headers`` (names the options that are Celery stamps,
#: each sent in the ``stamps`` header), ``replaced_task_nesting`` (how many times the task
#: replaced another: ``Task.replace``), and the publish's ``retry`` (bool) and ``retry_policy``
#: (kombu's: ``max_retries``, ``interval_start``, ``interval_step``, ``interval_max``).
CANVAS_OPTIONS = frozenset({"link", "link_error", "chain", "chord", "group_index", "headers", "reply_to",
                            "route_name", "argsrepr", "kwargsrepr", "stamped_headers", "retry",
                            "retry_policy", "replaced_task_nesting"})

#: Options Celery's client keeps for itself (``add_to_parent``: whether a task sent while
#: another runs is recorded as its child, which the worker stores with its result; a group
#: records itself rather than each of its tasks) or that a signature may carry without meaning
#: (``immutable``, set as an option by Celery's ``chord.link_error``): accepted and not sent.
IGNORED_OPTIONS = frozenset({"add_to_parent", "immutable"})

#: What a plain task adds to its publish: nothing.
PLAIN: Mapping[str, Any] = {}


@attrs.frozen
class Extra:
    """What the options of one ``send_task`` call add: to the message (``task_message``'s
    arguments), its headers, its route and its publish."""

    message: Mapping[str, Any]
    headers: Mapping[str, Any] | None = None
    route_name: str | None = None
    publish: Mapping[str, Any] = PLAIN


def as_list(value: Any) -> Any:
    """``link``/``link_error`` as the message carries them: a list or tuple as it is, anything
    else (one signature) in a list of one."""
    return value if isinstance(value, (list, tuple)) else [value]


def _nesting(name: str, value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"send_task({name!r}): replaced_task_nesting must be a whole number, 0 or more "
                        f"(got {value!r})")
    return value


def extra_options(app: App, name: str, options: Mapping[str, Any]) -> Extra:
    """Sort the options of a ``send_task(name, ..., **options)`` call.

    :raise TypeError: an option this client does not know or cannot honour, named with the fix.
    """
    stamped = options.get("stamped_headers") or ()
    if isinstance(stamped, str) or not all(isinstance(item, str) for item in stamped):
        raise TypeError(f"send_task({name!r}): stamped_headers must be a list of option names "
                        f"(got {stamped!r})")
    unknown = sorted(set(options) - CANVAS_OPTIONS - IGNORED_OPTIONS - set(stamped))
    if unknown:
        raise TypeError(
            f"send_task({name!r}) got the option {unknown[0]!r}, which this client does not take; it "
            f"routes by queue (queue=, or the task_routes setting) and publishes on its own "
            f"connection. The options beyond the plain ones are {', '.join(sorted(CANVAS_OPTIONS))}"
        )
    retry, policy = options.get("retry"), options.get("retry_policy")
    if retry is not None and not isinstance(retry, bool):
        raise TypeError(f"send_task({name!r}): retry must be True or False (got {retry!r})")
    if policy is not None and not isinstance(policy, Mapping):
        raise TypeError(f"send_task({name!r}): retry_policy must be a mapping (got {policy!r})")
    headers = options.get("headers")
    if headers is not None and not isinstance(headers, Mapping):
        raise TypeError(f"send_task({name!r}): headers must be a mapping (got {headers!r})")
    link, link_error = options.get("link"), options.get("link_error")
    chain, chord = options.get("chain"), options.get("chord")
    reply_to = options.get("reply_to")
    if reply_to is None and (link is not None or link_error is not None or chain is not None
                             or chord is not None or app.replies_to_sender()):
        # as Celery's client names itself: a plain task's stays empty unless results come back
        # to the sender (rpc://)
        reply_to = app.thread_oid
    message = {
        "group_index": options.get("group_index"),
        "reply_to": reply_to,
        "callbacks": None if link is None else as_list(link),
        "errbacks": None if link_error is None else as_list(link_error),
        "chain": chain,
        "chord": chord,
        "argsrepr": options.get("argsrepr"),
        "kwargsrepr": options.get("kwargsrepr"),
        "stamps": {header: options[header] for header in stamped if header in options} if stamped else None,
        "replaced_task_nesting": _nesting(name, options.get("replaced_task_nesting")),
    }
    publish = {key: value for key, value in (("retry", retry), ("retry_policy", policy)) if value is not None}
    return Extra(message=message, headers=headers, route_name=options.get("route_name"), publish=publish)
