"""Reading task messages: protocol v2 (and v1 bodies), checked header by header.

Every problem raises :class:`ProtocolError` (or its :class:`ContentDisallowed` and
:class:`DecodeError`) whose message says which header or part is wrong and what was received, so
the worker can reject the message with one log line and go on.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs
from kombu.serialization import loads as kombu_loads

from ..exceptions import ContentDisallowed, DecodeError, ProtocolError
from .fastjson import loads as json_loads
from .message import safe_repr
from .times import parse_iso

__all__ = ["JSON", "TaskEnvelope", "decode_task"]

JSON = "application/json"
_MISSING = object()


@attrs.define(slots=True, eq=False)
class TaskEnvelope:
    """A decoded task message: what to run, with what, and the protocol fields around it.

    Read-only by convention: it is built once per message on the worker's hot path, where a
    frozen class's per-field ``object.__setattr__`` cost more than everything else here together.
    """

    name: str
    id: str
    args: list[Any]
    kwargs: dict[str, Any]
    embed: Mapping[str, Any] | None
    retries: int = 0
    eta: datetime | None = None
    expires: datetime | None = None
    time_limit: float | None = None
    soft_time_limit: float | None = None
    root_id: str | None = None
    parent_id: str | None = None
    group: str | None = None
    group_index: int | None = None
    origin: str | None = None
    shadow: str | None = None
    ignore_result: bool = False
    argsrepr: str = ""
    kwargsrepr: str = ""
    reply_to: str | None = None
    correlation_id: str | None = None
    headers: Mapping[str, Any] = attrs.field(factory=dict, repr=False)


def _describe(value: Any) -> str:
    return f"{safe_repr(value, 80)} that is a {type(value).__name__}"


def _text(headers: Mapping[str, Any], key: str, *, required: bool = False) -> str | None:
    value = headers.get(key)
    if value is None:
        if required:
            raise ProtocolError(f"header {key!r} is missing")
        return None
    if not isinstance(value, str):
        raise ProtocolError(f"header {key!r} must be a string (got {_describe(value)})")
    if required and not value:
        raise ProtocolError(f"header {key!r} must not be empty")
    return value


def _whole(headers: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = headers.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"header {key!r} must be a whole number, 0 or more (got {_describe(value)})")
    return value


def _moment(headers: Mapping[str, Any], key: str) -> datetime | None:
    value = headers.get(key)
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else parse_iso(value.isoformat())
    if not isinstance(value, str):
        raise ProtocolError(f"header {key!r} must be an ISO 8601 date-time (got {_describe(value)})")
    try:
        return parse_iso(value)
    except (ValueError, OverflowError):
        raise ProtocolError(
            f"header {key!r} is not an ISO 8601 date-time (got {safe_repr(value, 80)})"
        ) from None


def _limit(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
        raise ValueError
    return float(value) or None


def _timelimit(headers: Mapping[str, Any]) -> tuple[float | None, float | None]:
    value = headers.get("timelimit")
    if value is None:
        return None, None
    try:
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ValueError
        return _limit(value[0]), _limit(value[1])
    except ValueError:
        raise ProtocolError(
            "header 'timelimit' must be [hard, soft] with numbers of seconds or nulls "
            f"(got {_describe(value)})"
        ) from None


#: content types whose decoding runs code the sender chose (pickle): never advised
UNSAFE = frozenset({"application/x-python-serialize"})


#: the content type of signed messages (Celery's ``auth`` serializer)
SIGNED = "application/data"


def _disallowed(content_type: str, accept: frozenset[str]) -> str:
    accepted = ", ".join(sorted(accept))
    if accept == {SIGNED}:
        return (f"content type {content_type!r} is not accepted: this worker only accepts signed messages "
                f"(accept_content=['auth']); the sender must sign them with task_serializer='auth', "
                f"security_key and security_certificate")
    if content_type in UNSAFE:
        # Decoding it runs whatever code the sender chose: it is not something to switch on.
        return f"content type {content_type!r} is not accepted (accepted: {accepted})"
    return (f"content type {content_type!r} is not accepted (accepted: {accepted}); add its serializer "
            f"to the accept_content setting to allow it")


def _decode_body(body: Any, content_type: str | None, content_encoding: str | None,
                 accept: frozenset[str], max_size: int) -> Any:
    content_type = content_type or JSON
    if content_type not in accept:
        raise ContentDisallowed(_disallowed(content_type, accept))
    size = len(body) if isinstance(body, (bytes, bytearray, memoryview, str)) else 0
    if size > max_size:
        raise ProtocolError(
            f"body is {size} bytes, more than worker_max_message_size ({max_size} bytes)"
        )
    try:
        if content_type == JSON:
            if not isinstance(body, str):
                body = bytes(body).decode(content_encoding or "utf-8")
            return json_loads(body)
        return kombu_loads(
            body, content_type, content_encoding or "utf-8", accept=accept
        )
    except RecursionError:
        raise DecodeError(f"body cannot be decoded as {content_type}: nested too deeply") from None
    except ProtocolError:
        raise  # a serializer that already says what is wrong (a signature that does not verify)
    except Exception as exc:
        if exc.args and isinstance(exc.args[0], ProtocolError):
            raise exc.args[0] from None  # the same, wrapped by kombu's loads in its DecodeError
        raise DecodeError(
            f"body cannot be decoded as {content_type}: {type(exc).__name__}: {exc}"
        ) from None


def _split_v2(payload: Any) -> tuple[list[Any], dict[str, Any], Mapping[str, Any] | None]:
    if not isinstance(payload, (list, tuple)) or len(payload) not in (2, 3):
        raise ProtocolError(f"body must be [args, kwargs, embed] (got {_describe(payload)})")
    args, kwargs = payload[0], payload[1]
    embed = payload[2] if len(payload) == 3 else None
    if not isinstance(args, (list, tuple)):
        raise ProtocolError(f"body args must be a list (got {_describe(args)})")
    if not isinstance(kwargs, dict):
        raise ProtocolError(f"body kwargs must be an object (got {_describe(kwargs)})")
    for key in kwargs:
        if not isinstance(key, str):
            raise ProtocolError(f"body kwargs keys must be strings (got {_describe(key)})")
    if embed is not None and not isinstance(embed, dict):
        raise ProtocolError(f"body embed must be an object or null (got {_describe(embed)})")
    return list(args), kwargs, embed


def _v1_to_v2(payload: Any) -> tuple[dict[str, Any], tuple[Any, Any, Any]]:
    """Headers and body for a version 1 message (everything in a dict body)."""
    if not isinstance(payload, dict) or "task" not in payload:
        raise ProtocolError(
            "message has no 'task' header and its body is not a version 1 task "
            f"(got {_describe(payload)})"
        )
    task_id = payload.get("id")
    headers = {
        "task": payload.get("task"),
        "id": task_id,
        "retries": payload.get("retries", 0),
        "eta": payload.get("eta"),
        "expires": payload.get("expires"),
        "timelimit": payload.get("timelimit"),
        "group": payload.get("taskset"),
        "root_id": task_id,
    }
    embed = {"callbacks": payload.get("callbacks"), "errbacks": payload.get("errbacks"),
             "chord": payload.get("chord"), "chain": None}
    return headers, (payload.get("args") or [], payload.get("kwargs") or {}, embed)


def decode_task(
    headers: Mapping[str, Any] | None,
    properties: Mapping[str, Any] | None,
    body: Any,
    content_type: str | None,
    content_encoding: str | None,
    *,
    accept: frozenset[str],
    max_size: int,
) -> TaskEnvelope:
    """Decode and check one task message.

    :param accept: content types allowed (``application/json`` by default; never pickle unless
        the user added it).
    :param max_size: largest body in bytes.
    :raise ProtocolError: the message is malformed; the message says what and where.
    """
    if headers is not None and not isinstance(headers, Mapping):
        raise ProtocolError(f"headers must be a mapping (got {_describe(headers)})")
    headers = headers or {}
    properties = properties if isinstance(properties, Mapping) else {}
    payload = _decode_body(body, content_type, content_encoding, accept, max_size)
    if headers.get("task", _MISSING) is _MISSING:
        headers, payload = _v1_to_v2(payload)
    args, kwargs, embed = _split_v2(payload)
    time_limit, soft_time_limit = _timelimit(headers)
    ignore_result = headers.get("ignore_result")
    if ignore_result is None:  # Celery's send_task writes null when the caller did not say
        ignore_result = False
    if not isinstance(ignore_result, bool):
        raise ProtocolError(f"header 'ignore_result' must be true or false (got {_describe(ignore_result)})")
    argsrepr = headers.get("argsrepr")
    kwargsrepr = headers.get("kwargsrepr")
    reply_to = properties.get("reply_to")
    correlation_id = properties.get("correlation_id")
    # positional, in the fields' order (keywords cost more than the checks above)
    return TaskEnvelope(
        _text(headers, "task", required=True),  # type: ignore[arg-type]  # name
        _text(headers, "id", required=True),  # type: ignore[arg-type]  # id
        args,
        kwargs,
        embed,
        _whole(headers, "retries", 0) or 0,  # retries
        _moment(headers, "eta"),
        _moment(headers, "expires"),
        time_limit,
        soft_time_limit,
        _text(headers, "root_id"),
        _text(headers, "parent_id"),
        _text(headers, "group"),
        _whole(headers, "group_index", None),
        _text(headers, "origin"),
        _text(headers, "shadow"),
        ignore_result,
        argsrepr if isinstance(argsrepr, str) else safe_repr(args),
        kwargsrepr if isinstance(kwargsrepr, str) else safe_repr(kwargs),
        reply_to if isinstance(reply_to, str) else None,
        correlation_id if isinstance(correlation_id, str) else None,
        headers,
    )
