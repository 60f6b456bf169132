"""Canvas: signatures, and the workflows built of them (chain, group, chord, map, starmap,
chunks), wire-identical to Celery's, as one representation for clients and workers.

A client builds them from tasks (``add.s(2, 2) | add.s(4)``, ``group(...)``, ``chord(...)``) and
sends them with ``apply_async()``; a worker rebuilds the signatures a message carries with
:func:`from_dict`/:func:`maybe_signature` (or :class:`~.embed.Embed`) and does what follows a
finished task with :mod:`.after` (callbacks, the chain's next step, errbacks), :mod:`.joins`
(chords) and the built-in tasks of :mod:`worker_core.app.builtins`.
"""

from .chains import chain
from .chords import chord
from .embed import Embed, apply_to_result, send_callbacks, send_errbacks, send_next_step
from .groups import group
from .maps import chunks, xmap, xstarmap
from .signatures import Signature, from_dict, maybe_signature, signature

__all__ = [
    "Embed",
    "Signature",
    "apply_to_result",
    "chain",
    "chord",
    "chunks",
    "from_dict",
    "group",
    "maybe_signature",
    "send_callbacks",
    "send_errbacks",
    "send_next_step",
    "signature",
    "xmap",
    "xstarmap",
]
