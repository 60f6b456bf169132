"""The Lua scripts the Redis transport and result backend run, each one atomic round trip.

They write exactly what kombu and Celery write (the ``unacked`` hash and ``unacked_index`` sorted
set; ``celery-task-meta-<id>`` with its PUBLISH), so Celery workers and clients share the keys.
A lease's score is the Redis server's own time (``TIME``), never a worker's: a worker whose clock
is off neither makes its leases look stale to the others nor takes theirs for stale.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

__all__ = ["ACK", "FETCH", "FETCH_SHA", "RECORD", "RENEW", "STALE", "STORE_RESULT", "run"]

#: The server's time in seconds (``now``), and as the score kombu gives ``unacked_index``, to the
#: microsecond (``stamp``, a string: Lua would print a number to 14 digits). Redis < 5 must be
#: told that a script that reads the time replicates its effects, not itself.
_NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local stamp = string.format('%d.%06d', tonumber(clock[1]), tonumber(clock[2]))
"""

#: Acknowledge, record messages BRPOP took, then take up to ARGV[1] more messages and record
#: them as unacked, atomically.
#:
#: KEYS[1] the ``unacked`` hash, KEYS[2] the ``unacked_index`` sorted set, KEYS[3..] the queue
#: lists in kombu's BRPOP order (priority step major, queue minor).
#: ARGV: [1] most messages, [2] number of queues, [3] "1" to rotate a queue to the end after
#: taking from it (kombu's round-robin cycle), [4] number of acknowledged tags, then those tags,
#: then the number of payloads BRPOP took
#: (delivered already, to be recorded as unacked), then for each its delivery tag, the JSON of
#: its exchange and routing key, and the payload (the channel read them when it delivered it:
#: the record is made under the tag the consumer acknowledges).
#:
#: Returns ``[stamp, key_index, delivery_tag, payload, ...]``: the score of the records it made,
#: then for each message taken: key_index is 1-based into KEYS[3..],
#: negative for a payload without a delivery tag (it cannot be recorded; the channel logs and
#: drops it, as kombu would fail on it). The
#: unacked value is ``[payload, exchange, routing_key]`` as kombu writes it, with the payload
#: embedded verbatim: re-encoding it with cjson would turn empty lists into objects. Records are
#: scored with the server's time. Refused as a whole or not at all: its first write is a ``ZADD XX``
#: of no member (it changes nothing), which Redis out of memory (``OOM``: it would let a script
#: that already wrote go on past ``maxmemory``) or a replica (``READONLY``) refuses before
#: anything changed, so a full Redis takes no message it could not record.
FETCH = _NOW + """
local unacked, index = KEYS[1], KEYS[2]
redis.call('ZADD', index, 'XX', stamp, 'worker-lease-probe')
local want = tonumber(ARGV[1])
local score = stamp
local nqueues = tonumber(ARGV[2])
local rotate = ARGV[3] == '1'
local nacks = tonumber(ARGV[4])

-- The delivery tag and the JSON of the exchange and routing key of a kombu payload. kombu writes
-- properties last, delivery_info inside them and delivery_tag last of all: read them from the
-- tail without decoding (a third of the cost); anything else is decoded with cjson.
local backslash = string.char(92)
local function describe(item)
  local n = #item
  local tag, exchange, routing_key
  local _, e = string.find(item, '"delivery_tag": "', math.max(1, n - 80), true)
  if e then
    local q = string.find(item, '"', e + 1, true)
    if q == n - 2 and string.sub(item, q) == '"}}' then
      tag = string.sub(item, e + 1, q - 1)
    end
  end
  if tag and tag ~= '' and not string.find(tag, backslash, 1, true) then
    local _, e2 = string.find(item, '"delivery_info": {"exchange": "', math.max(1, n - 600), true)
    if e2 then
      local q = string.find(item, '"', e2 + 1, true)
      local sep = '", "routing_key": "'
      if q and string.sub(item, q, q + #sep - 1) == sep then
        local q2 = string.find(item, '"', q + #sep, true)
        if q2 then
          exchange = string.sub(item, e2 + 1, q - 1)
          routing_key = string.sub(item, q + #sep, q2 - 1)
          if not string.find(exchange .. routing_key, backslash, 1, true) then
            return tag, '"' .. exchange .. '"', '"' .. routing_key .. '"'
          end
        end
      end
    end
  end
  local ok, message = pcall(cjson.decode, item)
  if not (ok and type(message) == 'table' and type(message['properties']) == 'table') then
    return nil
  end
  local properties = message['properties']
  tag = properties['delivery_tag']
  if type(tag) ~= 'string' or tag == '' then
    return nil
  end
  local info = properties['delivery_info']
  if type(info) == 'table' then
    exchange, routing_key = info['exchange'], info['routing_key']
  end
  return tag, cjson.encode(exchange), cjson.encode(routing_key)
end

local first = 5
while first < 5 + nacks do
  local last = math.min(first + 499, 4 + nacks)
  redis.call('ZREM', index, unpack(ARGV, first, last))
  redis.call('HDEL', unacked, unpack(ARGV, first, last))
  first = last + 1
end

local out, zargs, hargs = {stamp}, {}, {}
local function record(tag, item, exchange, routing_key)
  zargs[#zargs + 1] = score
  zargs[#zargs + 1] = tag
  hargs[#hargs + 1] = tag
  hargs[#hargs + 1] = '[' .. item .. ', ' .. exchange .. ', ' .. routing_key .. ']'
end

local nbook = tonumber(ARGV[5 + nacks])
for i = 6 + nacks, 5 + nacks + 4 * nbook, 4 do
  record(ARGV[i], ARGV[i + 3], ARGV[i + 1], ARGV[i + 2])
end

local order = {}
for q = 1, nqueues do order[q] = q end
local nsteps = (#KEYS - 2) / nqueues
local empty = {}
local got = 0
while got < want do
  local key, pos, item = nil, nil, nil
  for step = 0, nsteps - 1 do
    for p = 1, nqueues do
      local k = step * nqueues + order[p]
      if not empty[k] then
        item = redis.call('RPOP', KEYS[k + 2])
        if item then key, pos = k, p break end
        empty[k] = true
      end
    end
    if key then break end
  end
  if not key then break end
  got = got + 1
  if rotate and nqueues > 1 then
    local moved = table.remove(order, pos)
    order[#order + 1] = moved
  end
  local tag, exchange, routing_key = describe(item)
  if tag then
    record(tag, item, exchange, routing_key)
    out[#out + 1] = key
    out[#out + 1] = tag
  else
    out[#out + 1] = -key
    out[#out + 1] = ''
  end
  out[#out + 1] = item
end
if #zargs > 0 then
  redis.call('ZADD', index, unpack(zargs))
  redis.call('HSET', unacked, unpack(hargs))
end
return out
"""
FETCH_SHA = hashlib.sha1(FETCH.encode()).hexdigest()

#: Renew the leases of the messages a worker holds, at the server's time, and say which it lost.
#:
#: KEYS[1] ``unacked_index``, KEYS[2] kombu's restore mutex (``unacked_mutex``). ARGV: groups of
#: ``score, count, tag...``: the score this worker last gave those tags. A tag whose entry still
#: has that score is this worker's lease, and gets the server's time; one whose entry is gone, or
#: has another score, was restored by someone who took its lease for stale (and maybe delivered
#: again: a copy's record has the same tag, and the score of its delivery). A group whose score is
#: '' (the worker's record of those is on its way) is renewed where it is there, and never judged.
#: Returns ``[state, stamp, lost, tag, ...]``: state 1 when a restore held the mutex meanwhile (a
#: tag it read as stale may be restored after this renewal: the answer is not final), else 0; the
#: new score; how many tags follow that were lost; then the tags of '' groups that were renewed.
#: With no tags it writes nothing but is refused as a write would be (``ZADD XX`` of no member a
#: worker uses): a probe of whether Redis takes writes again.
RENEW = _NOW + """
local index = KEYS[1]
local state = redis.call('EXISTS', KEYS[2])
if #ARGV == 0 then
  redis.call('ZADD', index, 'XX', stamp, 'worker-lease-probe')
  return {state, stamp, 0}
end
local lost, found, zargs = {}, {}, {}
local i = 1
while i <= #ARGV do
  local expected, count = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  for j = i + 2, i + 1 + count do
    local tag = ARGV[j]
    local score = redis.call('ZSCORE', index, tag)
    if score and (expected == nil or tonumber(score) == expected) then
      zargs[#zargs + 1] = stamp
      zargs[#zargs + 1] = tag
      if #zargs >= 1000 then
        redis.call('ZADD', index, 'XX', unpack(zargs))
        zargs = {}
      end
      if expected == nil then
        found[#found + 1] = tag
      end
    elseif expected ~= nil then
      lost[#lost + 1] = tag
    end
  end
  i = i + 2 + count
end
if #zargs > 0 then
  redis.call('ZADD', index, 'XX', unpack(zargs))
end
local out = {state, stamp, #lost}
for _, tag in ipairs(lost) do out[#out + 1] = tag end
for _, tag in ipairs(found) do out[#out + 1] = tag end
return out
"""

#: Record a delivered message as unacknowledged, as kombu does, scored at the server's time.
#: KEYS[1] ``unacked``, KEYS[2] ``unacked_index``; ARGV[1] the delivery tag, ARGV[2] the record
#: (``[payload, exchange, routing_key]``). Pairs of ARGV after them record more messages.
#: Returns the score.
RECORD = _NOW + """
for i = 1, #ARGV, 2 do
  redis.call('ZADD', KEYS[2], stamp, ARGV[i])
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
return stamp
"""

#: Acknowledge: drop the ``unacked`` records of ARGV (delivery tags). KEYS[1] ``unacked``, KEYS[2]
#: ``unacked_index``. A script, not a MULTI: Redis out of memory refuses every command queued in a
#: MULTI, where these removals are allowed.
ACK = """
for first = 1, #ARGV, 500 do
  local last = math.min(first + 499, #ARGV)
  redis.call('ZREM', KEYS[2], unpack(ARGV, first, last))
  redis.call('HDEL', KEYS[1], unpack(ARGV, first, last))
end
return 1
"""

#: The delivery tags whose lease is older than the visibility timeout by the server's clock, as
#: kombu's restore reads them (highest score first). KEYS[1] ``unacked_index``; ARGV[1] the
#: visibility timeout, ARGV[2] the offset, ARGV[3] how many (-1: all).
STALE = _NOW + """
local ceil = now - tonumber(ARGV[1])
if tonumber(ARGV[3]) < 0 then
  return redis.call('ZREVRANGEBYSCORE', KEYS[1], ceil, 0)
end
return redis.call('ZREVRANGEBYSCORE', KEYS[1], ceil, 0, 'LIMIT', tonumber(ARGV[2]), tonumber(ARGV[3]))
"""

#: Store a task result unless SUCCESS is already stored, and PUBLISH it, atomically.
#:
#: KEYS[1] ``celery-task-meta-<id>``; ARGV[1] the meta, ARGV[2] milliseconds to keep it (0:
#: forever). Whole seconds use SETEX, as Celery does. A JSON meta (no ARGV[3]) is checked here;
#: a meta in another serializer, which Lua cannot read, was checked by the caller, who passes
#: as ARGV[3] the SHA-1 of the value it read ('' for none): it is stored only if that value is
#: still there. Returns 1 if stored, 0 if ignored, -1 if the value changed since it was read.
STORE_RESULT = """
local current = redis.call('GET', KEYS[1])
if ARGV[3] then
  local seen = current and redis.sha1hex(current) or ''
  if seen ~= ARGV[3] then
    return -1
  end
elseif current then
  local ok, meta = pcall(cjson.decode, current)
  if ok and type(meta) == 'table' and meta['status'] == 'SUCCESS' then
    return 0
  end
end
local ms = tonumber(ARGV[2])
if ms <= 0 then
  redis.call('SET', KEYS[1], ARGV[1])
elseif ms % 1000 == 0 then
  redis.call('SETEX', KEYS[1], ms / 1000, ARGV[1])
else
  redis.call('PSETEX', KEYS[1], ms, ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
"""


def run(client: Any, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run ``script`` with ``EVAL`` on ``client``: ``keys`` go as given (kombu's prefixing client
    leaves ``EVAL`` alone, so they carry the ``global_keyprefix`` already)."""
    return client.execute_command("EVAL", script, len(keys), *keys, *args)
