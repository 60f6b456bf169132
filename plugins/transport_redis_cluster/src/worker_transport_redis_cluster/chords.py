"""Chords on the cluster's result backend, counted as Celery's Redis backend counts them, in keys
that share the group id as their hash tag (``celery-taskset-meta-{<group id>}`` and its ``.s``
size, ``.t`` added, ``.j`` results, ``.d`` parts recorded, ``.c`` claim), so one script records a
part, refreshes the expiry and claims the body atomically, on the primary of the group's slot
(:class:`worker_core.slots.JoinsChords`)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from worker_core.exceptions import ResultError
from worker_core.slots import ChordCount

from .scripts import Script

if TYPE_CHECKING:
    from worker_core.results import ResultCodec

__all__ = ["COUNT_PART", "DONE_SECONDS", "FINISH", "ClusterChords"]

#: Record one header result once per task id and place, refresh the chord's expiry, and claim
#: the body when the results are all in.
#:
#: KEYS: [1] results ``.j``, [2] added ``.t``, [3] size ``.s``, [4] recorded ``.d``, [5] the saved
#: header (the group key), [6] claim ``.c``. ARGV: [1] task id, [2] the part, [3] "1" for a sorted
#: set (else a list), [4] the score (``group_index``, or ``+inf``), [5] seconds to keep the chord's
#: keys (0: as they are), [6] seconds to keep the saved header (0: as it is), [7] seconds the claim
#: lasts, [8] the claim. Returns ``{recorded, added, size, claimed}``; recorded is -1 once done.
COUNT_PART = Script(
    "chord-count",
    """
local results, added_key, size_key, recorded_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local keep, keep_header = tonumber(ARGV[5]), tonumber(ARGV[6])
if redis.call('GET', KEYS[6]) == 'done' then return {-1, false, false, 0} end
if redis.call('SADD', recorded_key, ARGV[1] .. ':' .. ARGV[4]) == 1 then
  if ARGV[3] == '1' then redis.call('ZADD', results, ARGV[4], ARGV[2])
  else redis.call('RPUSH', results, ARGV[2]) end
end
local recorded
if ARGV[3] == '1' then recorded = redis.call('ZCARD', results) else recorded = redis.call('LLEN', results) end
if keep > 0 then
  for _, key in ipairs({results, added_key, size_key, recorded_key}) do redis.call('EXPIRE', key, keep) end
  if keep_header > 0 then redis.call('EXPIRE', KEYS[5], keep_header) end
end
local added, size = redis.call('GET', added_key), redis.call('GET', size_key)
local claimed = 0
if size and recorded == tonumber(size) + tonumber(added or '0') then
  if redis.call('SET', KEYS[6], ARGV[8], 'NX', 'EX', tonumber(ARGV[7])) then claimed = 1 end
end
return {recorded, added, size, claimed}
""",
)

#: After the body was sent: if the claim is still ours, delete the chord's keys and leave
#: ``done`` in the claim's place for ARGV[2] seconds. KEYS: ``.c``, ``.j``, ``.t``, ``.s``,
#: ``.d``; ARGV: the claim, seconds. 1 when done, 0 when the claim was lost.
FINISH = Script(
    "chord-finish",
    """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('SET', KEYS[1], 'done', 'EX', tonumber(ARGV[2]))
return 1
""",
)

#: Seconds ``done`` is kept after a chord completed (Celery's least).
DONE_SECONDS = 300


class ClusterChords:
    """The chord half of the result backend, mixed into
    :class:`~worker_transport_redis_cluster.backend.RedisClusterBackend`."""

    chord_expires: float | None
    expires: float | None
    codec: ResultCodec
    chord_ordered: bool

    def group_key(self, group_id: str, suffix: str = "") -> str:
        raise NotImplementedError  # the backend's

    def _script(self, script: Script, keys: list[str], args: list[Any], action: str) -> Any:
        raise NotImplementedError  # the backend's

    def _command(self, key: str, command: tuple[Any, ...], action: str) -> Any:
        raise NotImplementedError  # the backend's

    # -- client side -------------------------------------------------------------------------------

    def apply_chord(self, group_id: str, header: Any) -> None:
        """Save the header as a group when a part of it is a group itself (its shape is what the
        body gets), as Celery's Redis backend does; a header of plain tasks needs nothing."""
        _, children = header
        if any(child[1] is not None for child in children):
            self._set_chord_key(group_id, "", self.codec.encode({"result": header}))

    def set_chord_size(self, group_id: str, size: int) -> None:
        """``.s`` = ``size``, after deleting ``.c`` (the claim or ``done`` of an earlier run of a
        chord sent again under the same group id)."""
        self._command(
            self.group_key(group_id, ".c"),
            ("DEL", self.group_key(group_id, ".c")),
            f"reset the chord of group {group_id}",
        )
        self._set_chord_key(group_id, ".s", size)

    def _set_chord_key(self, group_id: str, suffix: str, value: Any) -> None:
        key = self.group_key(group_id, suffix)
        seconds = round(self.chord_expires) if self.chord_expires else None
        command: tuple[Any, ...] = (
            ("SET", key, value) if seconds is None else ("SET", key, value, "EX", seconds)
        )
        self._command(key, command, f"store the chord state of group {group_id}")

    # -- worker side -------------------------------------------------------------------------------

    def add_to_chord(self, group_id: str, count: int = 1) -> None:
        key = self.group_key(group_id, ".t")
        self._command(key, ("INCRBY", key, count), f"add to the chord of group {group_id}")

    def count_chord_part(
        self,
        group_id: str,
        task_id: str,
        group_index: int | None,
        state: str,
        result: Any,
        *,
        claim_seconds: float,
    ) -> ChordCount:
        keep = round(self.chord_expires) if self.chord_expires else 0
        keep_header = max(keep, round(self.expires)) if keep and self.expires else 0
        claim = uuid.uuid4().hex
        keys = [self.group_key(group_id, suffix) for suffix in (".j", ".t", ".s", ".d", "", ".c")]
        part = self.codec.encode([1, task_id, state, result])
        args: list[Any] = [
            task_id,
            part,
            "1" if self.chord_ordered else "0",
            "+inf" if group_index is None else group_index,
            keep,
            keep_header,
            max(1, round(claim_seconds)),
            claim,
        ]
        recorded, added, size, claimed = self._script(
            COUNT_PART, keys, args, f"count a part of the chord of group {group_id}"
        )
        expected = None if size is None else int(size) + int(added or 0)
        return ChordCount(int(recorded), expected, claim if claimed else None)

    def chord_parts(self, group_id: str) -> list[tuple[str, str, Any]]:
        key = self.group_key(group_id, ".j")
        command = ("ZRANGE", key, 0, -1) if self.chord_ordered else ("LRANGE", key, 0, -1)
        parts = []
        for raw in self._command(key, command, f"read the results of the chord of group {group_id}") or ():
            value = self.codec.decode_value(raw, f"a result of the chord of group {group_id} ({key})")
            try:
                _, task_id, state, result = value
            except (ValueError, TypeError) as exc:
                raise ResultError(
                    f"a result of the chord of group {group_id} ({key}) is not Celery's [1, task_id, state, "
                    f"result]: {value!r} ({exc})"
                ) from exc
            parts.append((task_id, state, result))
        return parts

    def finish_chord(self, group_id: str, claim: str, *, sent: bool) -> bool:
        if not sent:
            key = self.group_key(group_id, ".s")
            self._command(key, ("DEL", key), f"drop the size of the chord of group {group_id}")
            return True
        keys = [self.group_key(group_id, suffix) for suffix in (".c", ".j", ".t", ".s", ".d")]
        return bool(
            self._script(FINISH, keys, [claim, DONE_SECONDS], f"finish the chord of group {group_id}")
        )
