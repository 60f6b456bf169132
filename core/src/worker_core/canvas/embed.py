"""The canvas a task message carries in its embed (``{"callbacks", "errbacks", "chain",
"chord"}``, the body's third item), and what a worker sends from it once the task finishes, as
Celery's worker does (``celery/app/trace.py``, ``celery/backends/base.py``):

- success: :func:`send_callbacks` with the return value, then :func:`send_next_step` of the
  chain with it (both before the result is stored, so ``children`` can list them);
- failure: :func:`send_errbacks` with the task's id (an errback registered in the worker that
  takes ``(request, exc, traceback)`` is called there instead; that choice is the worker's), and
  the task ids of :attr:`Embed.remaining` are failed too;
- a chord header task: :attr:`Embed.chord_body` is the body to send once the header is complete.

Every signature sent gets ``parent_id`` (the finished task) and ``root_id`` (its workflow's first
task), and keeps the task id its client gave it in advance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..exceptions import CanvasError
from ..protocol.message import safe_repr
from .groups import group
from .interface import CanvasApp
from .signatures import Signature, from_dict

__all__ = ["Embed", "apply_to_result", "read_signature", "read_signatures", "send_callbacks", "send_errbacks",
           "send_next_step"]


def read_signatures(app: CanvasApp, name: str, value: Any) -> tuple[Signature, ...]:
    """The signatures of the embed's part ``name`` (a list of their dicts, or null), sending
    with ``app``.

    :raise CanvasError: the part is not a list of signatures, named with what was received.
    """
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise CanvasError(f"the embed's {name!r} must be a list of signatures or null (got "
                          f"{safe_repr(value, 300)})")
    return tuple(read_signature(app, name, item) for item in value)


def read_signature(app: CanvasApp, name: str, value: Any) -> Signature:
    """One signature of the embed's part ``name`` (its dict), sending with ``app``.

    :raise CanvasError: it is not a signature this worker can send (not Celery's layout, an
        unknown kind), named with what was received.
    """
    try:
        sig = from_dict(value, app=app)
    except CanvasError as exc:
        raise CanvasError(f"the embed's {name!r} holds a malformed signature: {exc}") from None
    sig.app = app
    return sig


@attrs.frozen
class Embed:
    """A message's canvas, as signatures sending with the worker's app."""

    #: sent with the return value once the task succeeds (``link``)
    callbacks: tuple[Signature, ...] = ()
    #: sent with the task's id if it fails (``link_error``)
    errbacks: tuple[Signature, ...] = ()
    #: the rest of the task's chain, last step first, as the message carries it
    chain: tuple[Signature, ...] = ()
    #: the body of the chord whose header this task is part of
    chord: Signature | None = None

    @classmethod
    def parse(cls, embed: Mapping[str, Any] | None, app: CanvasApp) -> Embed:
        """Read a message's embed (None or missing keys: nothing to do).

        :raise CanvasError: a part is not what Celery puts there, named with what was received.
        """
        if embed is None:
            return cls()
        if not isinstance(embed, Mapping):
            raise CanvasError(f"a task message's embed must be a mapping (got {embed!r})")
        chord = embed.get("chord")
        return cls(
            callbacks=read_signatures(app, "callbacks", embed.get("callbacks")),
            errbacks=read_signatures(app, "errbacks", embed.get("errbacks")),
            chain=read_signatures(app, "chain", embed.get("chain")),
            chord=None if chord is None else read_signature(app, "chord", chord),
        )

    @property
    def next_step(self) -> Signature | None:
        """The chain's next signature, to apply to the return value."""
        return self.chain[-1] if self.chain else None

    @property
    def rest_of_chain(self) -> list[Signature]:
        """What the next step carries as its own ``chain`` (still last step first)."""
        return list(self.chain[:-1])

    @property
    def remaining(self) -> list[Signature]:
        """The chain's steps in the order they would run."""
        return list(reversed(self.chain))

    @property
    def chord_body(self) -> Signature | None:
        return self.chord


def apply_to_result(app: CanvasApp, sig: Mapping[str, Any], value: Any, *, parent_id: str | None,
                    root_id: str | None, chain: Sequence[Any] | None = None,
                    priority: int | None = None) -> Any:
    """Send ``sig`` (a signature or its dict from a message) with ``value`` put before its own
    arguments (unless immutable), as the child of task ``parent_id`` in workflow ``root_id``;
    ``chain`` is the rest of a chain it carries on. Returns its result handle."""
    target = sig if isinstance(sig, Signature) else read_signature(app, "signature", sig)
    if target.known_app is None:
        target.app = app
    return target.apply_async((value,), parent_id=parent_id, root_id=root_id, priority=priority,
                              chain=None if chain is None else list(chain))


def send_callbacks(app: CanvasApp, callbacks: Sequence[Signature], value: Any, *, parent_id: str | None,
                   root_id: str | None, priority: int | None = None) -> list[Any]:
    """Send a succeeded task's callbacks with its return value: one on its own; several as one
    group, except callbacks that are groups, each sent on its own. Returns their results."""
    if not callbacks:
        return []
    if len(callbacks) == 1:
        return [apply_to_result(app, callbacks[0], value, parent_id=parent_id, root_id=root_id,
                                priority=priority)]
    groups = [sig for sig in callbacks if isinstance(sig, group)]
    plain = [sig for sig in callbacks if not isinstance(sig, group)]
    sent = [each.apply_async((value,), parent_id=parent_id, root_id=root_id, priority=priority)
            for each in groups]
    if plain:
        sent.append(group(plain, app=app).apply_async((value,), parent_id=parent_id, root_id=root_id,
                                                      priority=priority))
    return sent


def send_next_step(app: CanvasApp, embed: Embed, value: Any, *, parent_id: str | None, root_id: str | None,
                   priority: int | None = None) -> Any:
    """Send the chain's next step with the return value, carrying the rest of the chain; None
    when the chain is done."""
    step = embed.next_step
    if step is None:
        return None
    return apply_to_result(app, step, value, parent_id=parent_id, root_id=root_id, chain=embed.rest_of_chain,
                           priority=priority)


def send_errbacks(app: CanvasApp, errbacks: Sequence[Signature], task_id: str, *,
                  root_id: str | None = None) -> Any:
    """Send errbacks of a failed task as one group, each given the task's id (Celery's errbacks
    of one argument); returns the group's result, None when there are none."""
    if not errbacks:
        return None
    return group(list(errbacks), app=app).apply_async((task_id,), parent_id=task_id,
                                                      root_id=root_id or task_id)
