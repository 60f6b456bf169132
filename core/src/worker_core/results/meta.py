"""Task states and the stored result format, exactly as Celery writes and reads them.

A stored result ("meta") is ``{"status", "result", "traceback", "children", "date_done",
"task_id"}`` plus ``group_id``/``parent_id`` when set; exceptions are stored as
``{"exc_type", "exc_message", "exc_module"}`` with ``exc_message`` holding ``exc.args``.
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from .. import exceptions as errors

__all__ = [
    "EXCEPTION_STATES",
    "FAILURE",
    "IGNORED",
    "PENDING",
    "PROPAGATE_STATES",
    "READY_STATES",
    "RECEIVED",
    "REJECTED",
    "RETRY",
    "REVOKED",
    "STARTED",
    "SUCCESS",
    "UNREADY_STATES",
    "decode_exception",
    "decode_result",
    "encode_exception",
    "make_meta",
    "pending_meta",
]

PENDING = "PENDING"
RECEIVED = "RECEIVED"
STARTED = "STARTED"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
RETRY = "RETRY"
REVOKED = "REVOKED"
REJECTED = "REJECTED"
IGNORED = "IGNORED"

READY_STATES = frozenset({SUCCESS, FAILURE, REVOKED})
UNREADY_STATES = frozenset({PENDING, RECEIVED, STARTED, REJECTED, RETRY})
EXCEPTION_STATES = frozenset({RETRY, FAILURE, REVOKED})
PROPAGATE_STATES = frozenset({FAILURE, REVOKED})

# Our exceptions travel under the names Celery clients know, and come back as ours.
_WIRE_NAMES: dict[type[BaseException], tuple[str, str]] = {
    errors.WorkerLostError: ("billiard.exceptions", "WorkerLostError"),
    errors.TimeLimitExceeded: ("billiard.exceptions", "TimeLimitExceeded"),
    errors.SoftTimeLimitExceeded: ("billiard.exceptions", "SoftTimeLimitExceeded"),
    errors.NotRegistered: ("celery.exceptions", "NotRegistered"),
    errors.MaxRetriesExceededError: ("celery.exceptions", "MaxRetriesExceededError"),
    errors.TaskRevokedError: ("celery.exceptions", "TaskRevokedError"),
    errors.ChordError: ("celery.exceptions", "ChordError"),
    errors.Retry: ("celery.exceptions", "Retry"),
    errors.Reject: ("celery.exceptions", "Reject"),
    errors.Ignore: ("celery.exceptions", "Ignore"),
    # refused messages
    errors.ProtocolError: ("celery.exceptions", "InvalidTaskError"),
    errors.ContentDisallowed: ("kombu.exceptions", "ContentDisallowed"),
    errors.DecodeError: ("kombu.exceptions", "DecodeError"),
    errors.SecurityError: ("celery.exceptions", "SecurityError"),
}
_FROM_WIRE = {wire: ours for ours, wire in _WIRE_NAMES.items()}


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def make_meta(
    task_id: str,
    state: str,
    result: Any,
    traceback: str | None = None,
    request: Mapping[str, Any] | None = None,
    *,
    children: list[Any] | None = None,
    extended: bool = False,
) -> dict[str, Any]:
    """The dict a backend stores for a task, in Celery's layout.

    :param result: already encoded: a plain value, or :func:`encode_exception` output for the
        exception states.
    :param request: the task's request fields; ``group`` and ``parent_id`` are copied when set,
        and with ``extended`` also name, args, kwargs, worker (hostname), retries and queue; its
        ``children`` (the result tuples of the tasks it sent) are stored unless ``children`` is
        given.
    """
    if children is None and request:
        children = request.get("children")
    meta: dict[str, Any] = {
        "status": state,
        "result": result,
        "traceback": traceback,
        "children": children or [],
        "date_done": _now_iso() if state in READY_STATES else None,
    }
    if request:
        if request.get("group"):
            meta["group_id"] = request["group"]
        if request.get("parent_id"):
            meta["parent_id"] = request["parent_id"]
        if extended:
            meta.update(
                name=request.get("task"),
                args=request.get("args"),
                kwargs=request.get("kwargs"),
                worker=request.get("hostname"),
                retries=request.get("retries"),
                queue=(request.get("delivery_info") or {}).get("routing_key"),
            )
    meta["task_id"] = task_id
    return meta


def pending_meta(task_id: str) -> dict[str, Any]:
    """What a client sees for a task with no stored result."""
    return {"status": PENDING, "result": None, "traceback": None, "children": [], "date_done": None,
            "task_id": task_id}


def _serializable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_serializable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _serializable(item) for key, item in value.items()}
    return repr(value)


def encode_exception(exc: BaseException) -> dict[str, Any]:
    """``{"exc_type", "exc_message", "exc_module"}`` with ``exc_message`` = ``exc.args``."""
    cls = type(exc)
    module, name = _WIRE_NAMES.get(cls, (cls.__module__, cls.__qualname__))
    return {"exc_type": name, "exc_message": _serializable(list(exc.args)), "exc_module": module}


def _find_class(module: str | None, name: str) -> type[BaseException] | None:
    ours = _FROM_WIRE.get((module or "", name))
    if ours is not None:
        return ours
    if module in (None, "", "builtins"):
        found = getattr(builtins, name, None)
    else:
        try:
            found = importlib.import_module(module)
            for part in name.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            found = None
        except Exception:  # a module that fails while importing is as good as absent
            found = None
    if isinstance(found, type) and issubclass(found, BaseException):
        return found
    if found is not None:
        raise errors.ResultError(
            f"refusing to rebuild exception {module}.{name}: it is not an exception class"
        )
    return None


def decode_exception(data: Mapping[str, Any]) -> BaseException:
    """Rebuild a stored exception as its own type when importable; otherwise as a new
    exception class of the same name (never anything that is not an exception)."""
    name = str(data.get("exc_type") or "Exception")
    module = data.get("exc_module")
    message = data.get("exc_message")
    args = tuple(message) if isinstance(message, (list, tuple)) else (message,)
    cls = _find_class(module, name)
    if cls is None:
        cls = type(name.rpartition(".")[2], (Exception,), {"__module__": module or "builtins"})
    try:
        return cls(*args)
    except Exception:
        fallback: type[BaseException] = type(
            name.rpartition(".")[2], (Exception,), {"__module__": module or "builtins"}
        )
        return fallback(*args)


def decode_result(meta: Mapping[str, Any]) -> Any:
    """The value of a stored result: the exception for exception states, else the result.
    (A Celery worker storing results in pickle stores the exception object itself.)"""
    result = meta.get("result")
    if meta.get("status") in EXCEPTION_STATES and isinstance(result, Mapping) and "exc_type" in result:
        return decode_exception(result)
    return result
