"""The Lua scripts the Redis transport and result backend run, each one atomic round trip.

They write exactly what kombu and Celery write (the ``unacked`` hash and ``unacked_index`` sorted
set; ``celery-task-meta-<id>`` with its PUBLISH), so Celery workers and clients share the keys.
"""

from __future__ import annotations

import hashlib

__all__ = ["FETCH", "FETCH_SHA", "STORE_RESULT"]

#: Acknowledge, record messages BRPOP took, then take up to ARGV[1] more messages and record
#: them as unacked, atomically.
#:
#: KEYS[1] the ``unacked`` hash, KEYS[2] the ``unacked_index`` sorted set, KEYS[3..] the queue
#: lists in kombu's BRPOP order (priority step major, queue minor).
#: ARGV: [1] most messages, [2] score (client time, as kombu's ZADD), [3] number of queues,
#: [4] "1" to rotate a queue to the end after taking from it (kombu's round-robin cycle),
#: [5] number of acknowledged tags, then those tags, then the number of payloads BRPOP took
#: (delivered already, to be recorded as unacked), then for each its delivery tag, the JSON of
#: its exchange and routing key, and the payload (the channel read them when it delivered it:
#: the record is made under the tag the consumer acknowledges).
#:
#: Returns ``[key_index, delivery_tag, payload, ...]``: key_index is 1-based into KEYS[3..],
#: negative for a payload without a delivery tag (it cannot be recorded; the channel logs and
#: drops it, as kombu would fail on it). The
#: unacked value is ``[payload, exchange, routing_key]`` as kombu writes it, with the payload
#: embedded verbatim: re-encoding it with cjson would turn empty lists into objects.
FETCH = """
local unacked, index = KEYS[1], KEYS[2]
local want = tonumber(ARGV[1])
local score = ARGV[2]
local nqueues = tonumber(ARGV[3])
local rotate = ARGV[4] == '1'
local nacks = tonumber(ARGV[5])

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

local first = 6
while first < 6 + nacks do
  local last = math.min(first + 499, 5 + nacks)
  redis.call('ZREM', index, unpack(ARGV, first, last))
  redis.call('HDEL', unacked, unpack(ARGV, first, last))
  first = last + 1
end

local out, zargs, hargs = {}, {}, {}
local function record(tag, item, exchange, routing_key)
  zargs[#zargs + 1] = score
  zargs[#zargs + 1] = tag
  hargs[#hargs + 1] = tag
  hargs[#hargs + 1] = '[' .. item .. ', ' .. exchange .. ', ' .. routing_key .. ']'
end

local nbook = tonumber(ARGV[6 + nacks])
for i = 7 + nacks, 6 + nacks + 4 * nbook, 4 do
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
