"""The Lua scripts of the broker side, each one atomic round trip on the primary of one queue's slot
(every key a script names shares the queue's hash tag, see :mod:`.keys`).

Deadlines are the broker's clock (``TIME`` inside the script), never a worker's, so workers whose
clocks disagree lease and reclaim by one clock: the primary's. ``WAKE`` arguments say how to wake
consumers: ``s`` SPUBLISH (sharded pub/sub, Redis 7), ``p`` PUBLISH, ``''`` not at all; a queue
wakes its consumers only when one of its lists goes from empty to one message, since a consumer
stops looking at a queue only after a fetch found it empty.
"""

from __future__ import annotations

import hashlib

import attrs

__all__ = ["ACK", "COUNT", "DELETE", "FETCH", "PUBLISH", "PURGE", "RECLAIM", "RENEW", "REQUEUE", "Script"]


@attrs.frozen
class Script:
    """A script and its SHA-1 (what EVALSHA names)."""

    name: str
    source: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


_NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

_WAKE = """
local function wake(channel, kind)
  if kind == 's' then redis.call('SPUBLISH', channel, '1')
  elseif kind == 'p' then redis.call('PUBLISH', channel, '1') end
end
"""

#: KEYS[1] the list of the message's priority step. ARGV: [1] the item, [2] the wake channel,
#: [3] how to wake. Returns the list's length.
PUBLISH = Script(
    "publish",
    _WAKE
    + """
local n = redis.call('LPUSH', KEYS[1], ARGV[1])
if n == 1 then wake(ARGV[2], ARGV[3]) end
return n
""",
)

#: Write acknowledgements, then take up to ARGV[2] messages in priority order, record each as
#: delivered to ARGV[1] under a lease of ARGV[3] ms (-1: record nothing, for a consumer that does
#: not acknowledge), atomically.
#:
#: KEYS: [1] unacked, [2] leases, [3] redelivered, [4..] the lists, first served first.
#: ARGV: [1] owner, [2] most messages, [3] lease ms, [4] number of acknowledged tags, then those
#: tags, then the step of each list.
#: Returns ``{n, tag * n, (flag, item) ...}``: the n acknowledged tags that held no record of this
#: owner (its lease had lapsed, or a failover lost the record), then each message taken with 1 when
#: it is delivered again, 0 when not, -1 when it has no tag (not recorded: it cannot be settled).
FETCH = Script(
    "fetch",
    _NOW
    + """
local unacked, leases, redelivered = KEYS[1], KEYS[2], KEYS[3]
local owner, want, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local nacks = tonumber(ARGV[4])
local out = {0}
for i = 5, 4 + nacks do
  if redis.call('ZREM', leases, ARGV[i] .. ' ' .. owner) == 1 then
    redis.call('HDEL', unacked, ARGV[i])
  else
    out[1] = out[1] + 1
    out[#out + 1] = ARGV[i]
  end
end
local steps = 5 + nacks
local got, deadline = 0, now + lease
for k = 4, #KEYS do
  if got >= want then break end
  local items = redis.call('RPOP', KEYS[k], want - got)
  if items then
    local step = ARGV[steps + k - 4]
    for _, item in ipairs(items) do
      got = got + 1
      local space = string.find(item, ' ', 1, true)
      if space and space > 1 then
        local tag = string.sub(item, 1, space - 1)
        if lease >= 0 then
          redis.call('HSET', unacked, tag, step .. ' ' .. item)
          redis.call('ZADD', leases, deadline, tag .. ' ' .. owner)
        end
        out[#out + 1] = redis.call('SREM', redelivered, tag)
      else
        out[#out + 1] = -1
      end
      out[#out + 1] = item
    end
  end
end
return out
""",
)

#: Acknowledge: drop the records of ARGV[2..] held by the owner ARGV[1]. KEYS: [1] unacked,
#: [2] leases. Returns the tags that held no record of this owner.
ACK = Script(
    "ack",
    """
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZREM', KEYS[2], ARGV[i] .. ' ' .. ARGV[1]) == 1 then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
""",
)

#: Renew the leases the owner ARGV[1] holds on ARGV[3..] to ARGV[2] ms from now. KEYS: [1]
#: leases. Returns the tags it no longer holds (lapsed and given back, or taken by another).
RENEW = Script(
    "renew",
    _NOW
    + """
local deadline, lost = now + tonumber(ARGV[2]), {}
for i = 3, #ARGV do
  local member = ARGV[i] .. ' ' .. ARGV[1]
  if redis.call('ZSCORE', KEYS[1], member) then
    redis.call('ZADD', KEYS[1], 'XX', deadline, member)
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
""",
)

_LISTS = """
local unacked, leases, redelivered = KEYS[1], KEYS[2], KEYS[3]
local lists, nsteps = {}, tonumber(ARGV[4])
for i = 1, nsteps do lists[ARGV[4 + i]] = KEYS[3 + i] end
local woken = {}
local function give_back(tag)
  local record = redis.call('HGET', unacked, tag)
  if not record then return false end
  local space = string.find(record, ' ', 1, true)
  local list = lists[string.sub(record, 1, space - 1)] or KEYS[4]
  if redis.call('RPUSH', list, string.sub(record, space + 1)) == 1 and not woken[list] then
    woken[list] = true
    wake(ARGV[2], ARGV[3])
  end
  redis.call('HDEL', unacked, tag)
  redis.call('SADD', redelivered, tag)
  return true
end
"""

#: Give messages the owner holds back to the head of their lists (the next taken), flagged as
#: delivered again: a reject with requeue, or what a closing consumer held.
#:
#: KEYS: [1] unacked, [2] leases, [3] redelivered, [4..] the lists. ARGV: [1] owner, [2] the wake
#: channel, [3] how to wake, [4] number of steps, then the steps, then the tags in the order they
#: were delivered (the first goes back first in line). Returns ``{given back, tag ...}``: how many,
#: then the tags it did not hold.
REQUEUE = Script(
    "requeue",
    _WAKE
    + _LISTS
    + """
local first, out = 5 + nsteps, {0}
for i = #ARGV, first, -1 do
  if redis.call('ZREM', leases, ARGV[i] .. ' ' .. ARGV[1]) == 1 and give_back(ARGV[i]) then
    out[1] = out[1] + 1
  else
    out[#out + 1] = ARGV[i]
  end
end
return out
""",
)

#: Give back (at most ARGV[1] of) the messages whose lease passed its deadline: their holder died,
#: stood still, or could not reach the broker for longer than the lease. KEYS as REQUEUE; ARGV:
#: [1] the most, [2] the wake channel, [3] how to wake, [4] number of steps, then the steps.
#: Returns the tags given back, the oldest lease first.
RECLAIM = Script(
    "reclaim",
    _NOW
    + _WAKE
    + _LISTS
    + """
local lapsed = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for i = #lapsed, 1, -1 do
  local member = lapsed[i]
  local tag = string.sub(member, 1, (string.find(member, ' ', 1, true) or 0) - 1)
  redis.call('ZREM', leases, member)
  if give_back(tag) then out[#out + 1] = tag end
end
return out
""",
)

#: Remove every ready message of a queue; KEYS: its lists. Returns how many.
PURGE = Script(
    "purge",
    """
local n = 0
for _, key in ipairs(KEYS) do
  n = n + redis.call('LLEN', key)
  redis.call('DEL', key)
end
return n
""",
)

#: Delete a queue: its lists and records. KEYS: every key of the queue.
DELETE = Script(
    "delete",
    """
return redis.call('DEL', unpack(KEYS))
""",
)

#: The poison cap's counter: KEYS[1] += 1, forgotten ARGV[1] ms after the last count.
COUNT = Script(
    "count",
    """
local n = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
""",
)
