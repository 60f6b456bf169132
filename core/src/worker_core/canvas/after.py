"""What follows a task on the worker side, in the process and thread that ran it, in Celery's
order (``celery/app/trace.py``, ``celery/backends/base.py``):

- success: the callbacks (``link``) and the chain's next step are sent with the return value,
  before the result is stored (so it lists them as ``children``); after it is stored, the chord
  the task is part of counts it;
- failure (after FAILURE is stored): the chord counts it, the rest of the chain is failed with
  the same error, then the errbacks (``link_error``) are called or sent;
- revoked or expired: the chord counts it; a retry does nothing here.

:class:`Workflow` is read from a message's embed once, by the executor, only for a message whose
embed holds something: a plain task pays one check in the worker's main process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..app.context import TaskContext
from ..exceptions import CanvasError
from ..protocol import safe_repr
from ..results.meta import FAILURE, REVOKED, SUCCESS, encode_exception
from ..slots import DiscardsResults, RepliesToSender
from .embed import apply_to_result, read_signature, read_signatures, send_callbacks
from .errbacks import call_errbacks
from .interface import CanvasApp
from .joins import count_chord_part, fail_chain
from .signatures import Signature

__all__ = ["EMBED_KEYS", "Workflow"]

logger = logging.getLogger("worker.canvas")

#: What a message's embed may hold (Celery's protocol v2).
EMBED_KEYS = ("callbacks", "errbacks", "chain", "chord")


class Workflow:
    """The canvas of one task message, as signatures sending with the worker's app, and what to
    do with it once the task finished.

    Read as :class:`~.embed.Embed` reads an embed (the same checks and messages), except the
    chain: only its next step is read, and the rest goes on in the next message as it came,
    rather than being read whole again at every step of a long chain.
    """

    __slots__ = ("app", "callbacks", "chain", "chord", "errbacks", "next_step")

    def __init__(self, app: CanvasApp, callbacks: tuple[Signature, ...], errbacks: tuple[Signature, ...],
                 chain: list[Any], next_step: Signature | None, chord: Signature | None) -> None:
        self.app = app
        self.callbacks = callbacks
        self.errbacks = errbacks
        #: the rest of the chain as the message carries it (last step first)
        self.chain = chain
        self.next_step = next_step
        self.chord = chord

    @classmethod
    def read(cls, app: CanvasApp, embed: Mapping[str, Any], context: TaskContext) -> Workflow:
        """Read a message's embed, and give ``context`` (the task's request) its parts as
        Celery's request has them.

        :raise CanvasError: a part this worker cannot honour (not Celery's layout, an unknown
            kind of signature), named with what was received.
        """
        if not isinstance(embed, Mapping):
            raise CanvasError(f"a task message's embed must be a mapping (got {safe_repr(embed, 300)})")
        chain = embed.get("chain") or []
        if not isinstance(chain, list) or not all(isinstance(step, Mapping) for step in chain):
            raise CanvasError(f"the embed's 'chain' must be a list of signatures, last step first (got "
                              f"{safe_repr(chain, 300)})")
        chord = embed.get("chord")
        # the chain's next step only: the rest goes on in the next message as it came
        workflow = cls(
            app,
            read_signatures(app, "callbacks", embed.get("callbacks") or None),
            read_signatures(app, "errbacks", embed.get("errbacks") or None),
            chain,
            read_signature(app, "chain", chain[-1]) if chain else None,
            None if chord is None else read_signature(app, "chord", chord),
        )
        context.callbacks = embed.get("callbacks") or None
        context.errbacks = embed.get("errbacks") or None
        context.chain = chain or None
        context.chord = chord
        context.replaced_task_nesting = embed.get("replaced_task_nesting") or 0
        return workflow

    # -- outcomes ------------------------------------------------------------------------------------

    def succeeded(self, context: TaskContext, retval: Any) -> None:
        """Send the callbacks, then the chain's next step (carrying the rest), with ``retval``
        before their own arguments, as children of this task; ``context`` must be the current
        request (what is sent is recorded in its ``children``)."""
        app = self.app
        task_id = context.id
        root_id = context.root_id or task_id
        inherit = app.settings.task_inherit_parent_priority
        priority = (context.delivery_info or {}).get("priority") if inherit else None
        if self.callbacks:
            send_callbacks(app, self.callbacks, retval, parent_id=task_id, root_id=root_id, priority=priority)
        if self.next_step is not None:
            apply_to_result(app, self.next_step, retval, parent_id=task_id, root_id=root_id,
                            chain=self.chain[:-1], priority=priority)

    def counted(self, context: TaskContext, state: str, result: Any) -> None:
        """Count this task (``state``, its ``result`` encoded as stored) for the chord it is
        part of, if any; the count that completes the chord sends its body."""
        if self.chord is None or not context.group or not context.id:
            return
        count_chord_part(self.app, self.chord, context.group, context.id, context.group_index, state, result)

    def failed(self, context: TaskContext, exc: BaseException, traceback: str | None) -> None:
        """After FAILURE is stored: count it for the chord, fail the rest of the chain, call or
        send the errbacks. Each step is tried even when one before it fails (that one is
        logged)."""
        app = self.app
        try:
            self.counted(context, FAILURE, encode_exception(exc))
        except Exception:
            logger.exception("Task %s[%s] failed, and its chord could not count it", context.task, context.id)
        try:
            fail_chain(app, self.chain, exc, traceback)
        except Exception:
            logger.exception("Task %s[%s] failed, and the rest of its chain could not be failed",
                             context.task, context.id)
        if self.errbacks:
            try:
                call_errbacks(app, self.errbacks, context, exc, traceback)
            except Exception:  # the broker is unreachable, say: the failure itself is stored
                logger.exception("Task %s[%s] failed, and its errbacks could not be sent", context.task,
                                 context.id)

    def revoked(self, context: TaskContext, exc: BaseException) -> None:
        """After REVOKED is stored (revoked or expired): count it for the chord."""
        self.counted(context, REVOKED, encode_exception(exc))

    def already_succeeded(self, context: TaskContext) -> bool:
        """For a message delivered again: when its task's SUCCESS is stored already, it is not
        run again; what it sends after itself is sent again only when its stored ``children``
        is empty (it was stopped before they were recorded, as Celery decides), and the chord
        counts it again (once: a part counts once). False when it must run, or when the
        backend keeps nothing a worker can read (``disabled``, or ``rpc://``, which sends each
        state to the task's client)."""
        app = self.app
        backend = app.backend
        if isinstance(backend, RepliesToSender) or (
                isinstance(backend, DiscardsResults) and backend.discards_results):
            return False
        try:
            meta = backend.get_task_meta(str(context.id))
        except Exception as exc:
            logger.warning("Task %s[%s] was delivered again and its stored state cannot be read (%s): it "
                           "runs again", context.task, context.id, exc)
            return False
        if meta.get("status") != SUCCESS:
            return False
        logger.info("Task %s[%s] ignored: it was delivered again and had succeeded already", context.task,
                    context.id)
        if (self.callbacks or self.next_step is not None) and not meta.get("children"):
            self.succeeded(context, meta.get("result"))
        self.counted(context, SUCCESS, meta.get("result"))
        return True
