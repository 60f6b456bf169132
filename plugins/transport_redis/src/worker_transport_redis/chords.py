"""Chords on the Redis result backend, in Celery's keys and steps, so Celery clients, Celery
workers and this worker count the same chords (:class:`worker_core.slots.JoinsChords`).

Under ``celery-taskset-meta-<group_id>`` (with the backend's key prefix): ``.s`` the chord's
size (set by the client), ``.t`` the results added while it runs, ``.j`` the header's results as
``[1, task_id, state, result]`` (a sorted set scored by ``group_index``, or a list when the
transport option ``result_chord_ordered`` is False), ``.d`` the parts recorded (``task_id:index``),
``.c`` the claim of the worker sending the body, then ``done``; the key itself holds a header
saved as a group (one that holds groups).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from worker_core.exceptions import ResultError
from worker_core.slots import ChordCount

if TYPE_CHECKING:
    from worker_core.results import ResultCodec

    from .backend import _Connected

__all__ = ["COUNT_PART", "FINISH", "RedisChords"]

#: Record one header result once, refresh the chord's expiry, and claim the body when the
#: results are all in; one atomic round trip.
#:
#: KEYS: [1] results ``.j``, [2] added ``.t``, [3] size ``.s``, [4] recorded ``.d``, [5] the
#: saved header (the group key), [6] claim ``.c``.
#: ARGV: [1] task id, [2] the part's JSON, [3] "1" for a sorted set, else a list, [4] the score
#: (``group_index``, or ``+inf``), [5] seconds to keep the chord's keys (0: as they are), [6]
#: seconds to keep the saved header (0: as it is), [7] seconds the claim lasts, [8] the claim.
#:
#: Returns ``{recorded, added, size, claimed}``; recorded is -1 once the chord is done.
COUNT_PART = """
local results, added_key, size_key, recorded_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local header_key, claim_key = KEYS[5], KEYS[6]
local keep, keep_header = tonumber(ARGV[5]), tonumber(ARGV[6])

if redis.call('GET', claim_key) == 'done' then
  return {-1, false, false, 0}
end

-- the task id with its place: two places in the header holding one frozen signature both count
local part = ARGV[1] .. ':' .. ARGV[4]
if redis.call('SADD', recorded_key, part) == 1 then
  if ARGV[3] == '1' then
    redis.call('ZADD', results, ARGV[4], ARGV[2])
  else
    redis.call('RPUSH', results, ARGV[2])
  end
end

local recorded
if ARGV[3] == '1' then
  recorded = redis.call('ZCARD', results)
else
  recorded = redis.call('LLEN', results)
end

if keep > 0 then
  redis.call('EXPIRE', results, keep)
  redis.call('EXPIRE', added_key, keep)
  redis.call('EXPIRE', size_key, keep)
  redis.call('EXPIRE', recorded_key, keep)
  if keep_header > 0 then
    redis.call('EXPIRE', header_key, keep_header)
  end
end

local added = redis.call('GET', added_key)
local size = redis.call('GET', size_key)
local claimed = 0
if size and recorded == tonumber(size) + tonumber(added or '0') then
  if redis.call('SET', claim_key, ARGV[8], 'NX', 'EX', tonumber(ARGV[7])) then
    claimed = 1
  end
end
return {recorded, added, size, claimed}
"""

#: After the body was sent: if the claim is still ours, delete the chord's keys and leave
#: ``done`` in the claim's place for ARGV[2] seconds.
#:
#: KEYS: [1] claim ``.c``, [2] ``.j``, [3] ``.t``, [4] ``.s``, [5] ``.d``; ARGV: [1] the claim,
#: [2] seconds ``done`` is kept. Returns 1 when done, 0 when the claim was lost.
FINISH = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('SET', KEYS[1], 'done', 'EX', tonumber(ARGV[2]))
return 1
"""

#: Seconds ``done`` is kept after a chord completed (Celery's least).
DONE_SECONDS = 300


class RedisChords:
    """The chord half of the Redis result backend (see :class:`~worker_core.slots.JoinsChords`).

    Mixed into :class:`~worker_transport_redis.backend.RedisBackend`, whose connection, retries,
    key names and settings it uses.
    """

    chord_expires: float | None
    expires: float | None
    codec: ResultCodec
    #: ``result_backend_transport_options['result_chord_ordered']`` (Celery's, True by default)
    chord_ordered: bool

    def group_key(self, group_id: str, suffix: str = "") -> str:
        raise NotImplementedError  # the backend's

    def _retrying(self, action: str, call: Callable[[_Connected], Any]) -> Any:
        raise NotImplementedError  # the backend's

    # -- client side -------------------------------------------------------------------------------

    def apply_chord(self, group_id: str, header: Any) -> None:
        """Save the header as a group when a part of it is a group itself (its shape is what the
        body gets), kept ``result_chord_expires``: what Celery's Redis backend does; a header
        of plain tasks needs nothing before it is sent."""
        _, children = header
        if any(child[1] is not None for child in children):
            self._set_chord_key(group_id, "", self.codec.encode({"result": header}))

    def set_chord_size(self, group_id: str, size: int) -> None:
        """``<group key>.s`` = ``size``, after deleting ``<group key>.c`` (the claim, or the
        ``done`` mark, of a previous run of a chord sent again under the same group id), as
        Celery's Redis backend does."""
        claim = self.group_key(group_id, ".c")
        self._retrying(f"reset the chord of group {group_id}",
                       lambda connected: connected.client.delete(claim))
        self._set_chord_key(group_id, ".s", size)

    def _set_chord_key(self, group_id: str, suffix: str, value: Any) -> None:
        key = self.group_key(group_id, suffix)
        seconds = round(self.chord_expires) if self.chord_expires else None
        self._retrying(f"store the chord state of group {group_id}",
                       lambda connected: connected.client.set(key, value, ex=seconds))

    # -- worker side -------------------------------------------------------------------------------

    def add_to_chord(self, group_id: str, count: int = 1) -> None:
        key = self.group_key(group_id, ".t")
        self._retrying(f"add to the chord of group {group_id}",
                       lambda connected: connected.client.incr(key, count))

    def count_chord_part(self, group_id: str, task_id: str, group_index: int | None, state: str,
                         result: Any, *, claim_seconds: float) -> ChordCount:
        keep = round(self.chord_expires) if self.chord_expires else 0
        # a saved header is read by clients too: never kept for less than the results
        keep_header = max(keep, round(self.expires)) if keep and self.expires else 0
        claim = uuid.uuid4().hex
        keys = [self.group_key(group_id, suffix) for suffix in (".j", ".t", ".s", ".d", "", ".c")]
        part = self.codec.encode([1, task_id, state, result])  # in result_serializer, as Celery's
        args: list[Any] = [task_id, part, "1" if self.chord_ordered else "0",
                           "+inf" if group_index is None else group_index, keep, keep_header,
                           max(1, round(claim_seconds)), claim]

        def count(connected: _Connected) -> Any:
            return connected.chord_count(keys=keys, args=args)

        action = f"count a part of the chord of group {group_id}"
        recorded, added, size, claimed = self._retrying(action, count)
        expected = None if size is None else int(size) + int(added or 0)
        return ChordCount(int(recorded), expected, claim if claimed else None)

    def chord_parts(self, group_id: str) -> list[tuple[str, str, Any]]:
        key = self.group_key(group_id, ".j")

        def read(connected: _Connected) -> Any:
            if self.chord_ordered:
                return connected.client.zrange(key, 0, -1)
            return connected.client.lrange(key, 0, -1)

        parts = []
        for raw in self._retrying(f"read the results of the chord of group {group_id}", read):
            value = self.codec.decode_value(raw, f"a result of the chord of group {group_id} ({key})")
            try:
                _, task_id, state, result = value
            except (ValueError, TypeError) as exc:
                raise ResultError(f"a result of the chord of group {group_id} ({key}) is not Celery's "
                                  f"[1, task_id, state, result]: {value!r} ({exc})") from exc
            parts.append((task_id, state, result))
        return parts

    def finish_chord(self, group_id: str, claim: str, *, sent: bool) -> bool:
        if not sent:
            size = self.group_key(group_id, ".s")
            self._retrying(f"drop the size of the chord of group {group_id}",
                           lambda connected: connected.client.delete(size))
            return True
        keys = [self.group_key(group_id, suffix) for suffix in (".c", ".j", ".t", ".s", ".d")]
        done = self._retrying(f"finish the chord of group {group_id}",
                              lambda connected: connected.chord_finish(keys=keys, args=[claim, DONE_SECONDS]))
        return bool(done)
