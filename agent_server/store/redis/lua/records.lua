--[[ records: the end of a record's life, and retention.
  KEYS[1..6] (of every script that includes this file): the key prefix `{agent-server:
  <agent>}:`, `all`, `running`, `finished`, `sizes`, `queue`. The prefix names the keys of
  ids learned here (walking `finished`, a record's session or owner) and the `ends` channel.
  Defines: P, ALL, RUNNING, FINISHED, SIZES, QUEUE, scoped(tenant, name), member(id,
  tenant, sid), drop(entry, rec, ev), prune(),
  ready(key), wait_in(key, id), release(key, id), unqueue(key, id) (concurrency keys),
  finish(rec, ev, id, sid, owned, size, r), cancel_queued(rec, ev, id, sid, reason,
  found). finish() deletes the requests for input the record kept (their answers among
  them), and publishes the end notice and prunes unless a script that writes many ends at
  once sets NOTIFY or PRUNE to false first (end.lua does, once for its batch). Every end
  passes through finish(), which records its webhook delivery (webhooks.lua) in `webhooks`
  and `webhook_bodies`, named from the prefix.
]]
--! include header.lua
--! include record.lua
--! include moves.lua
--! include webhooks.lua
local P, ALL, RUNNING, FINISHED, SIZES, QUEUE
--! each call
P, ALL, RUNNING, FINISHED, SIZES, QUEUE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
--! end each call

-- A name a client chose (a session id), as its tenant's: names.py `scoped`, the same
-- characters ('' is no tenant: the name as given).
local SEP = '\31'
local function scoped(tenant, name)
  if not tenant or tenant == '' then return name end
  return tenant .. SEP .. name
end

-- Its entry in `finished`: "{id}|{session id}", or "{id}|{tenant}\31{session id}" for a
-- tenant's: the id ends at the first '|' (an id has none), the tenant at the \31 after it
-- (no tenant or session id holds one), and what follows the '|' is the scoped session.
local function member(id, tenant, sid)
  if not tenant or tenant == '' then return id .. '|' .. sid end
  return id .. '|' .. tenant .. SEP .. sid
end

-- Delete a finished record and its index entries; `entry` is its entry in `finished`.
-- rec and ev, its hash and stream, are named from the prefix when not given.
local function drop(entry, rec, ev)
  local bar = string.find(entry, '|', 1, true)
  local id = string.sub(entry, 1, bar - 1)
  local rest = string.sub(entry, bar + 1)
  local sep = string.find(rest, SEP, 1, true)
  local sid = sep and string.sub(rest, sep + 1) or rest
  redis.call('DEL', rec or (P .. 'x:' .. id), ev or (P .. 'ev:' .. id))
  redis.call('ZREM', ALL, id)
  if sep then redis.call('ZREM', P .. 'tenant:' .. string.sub(rest, 1, sep - 1), id) end
  if sid ~= '' then redis.call('ZREM', P .. 'session:' .. rest, id) end
  redis.call('ZREM', FINISHED, entry)
  -- `sizes`: the bytes of each finished record's input, result and error, and their total under
  -- '#': retention by bytes (the record may have expired already: its size stays here).
  local size = redis.call('HGET', SIZES, id)
  if size then
    redis.call('HDEL', SIZES, id)
    redis.call('HINCRBY', SIZES, '#', -tonumber(size))
  end
end

-- Past result_ttl or over max_retained, oldest first; bounded work per call.
local function prune()
  local cutoff = NOW_US - TTL * 1000
  local old = redis.call('ZRANGEBYSCORE', FINISHED, '-inf', cutoff, 'LIMIT', 0, 100)
  for _, m in ipairs(old) do drop(m) end
  local over = redis.call('ZCARD', FINISHED) - MAXR
  if over > 0 then
    for _, m in ipairs(redis.call('ZRANGE', FINISHED, 0, math.min(over, 100) - 1)) do
      drop(m)
    end
  end
  -- Over max_retained_bytes: the oldest go, 100 at most per call; the newest always stays
  -- (a result larger than the budget is still read once).
  for _ = 1, 100 do
    if tonumber(redis.call('HGET', SIZES, '#') or '0') <= MAXB then break end
    local oldest = redis.call('ZRANGE', FINISHED, 0, 1)
    if not oldest[2] then break end
    drop(oldest[1])
  end
end

-- Whether finish() publishes the end notice itself: the outbox's writer publishes one
-- notice for the ends of a whole batch instead (see end.lua). Whether finish() prunes: the
-- end script prunes once for its whole batch instead. The highest score of `finished`, once
-- read (nothing but finish() raises it).
local NOTIFY, PRUNE, LAST
--! each call
NOTIFY, PRUNE, LAST = true, true, nil
--! end each call

-- Concurrency keys (claim.lua), named from the prefix: `ckeys`, every key with waiting work,
-- scored by when it last gave a slot (us); `cready`, those whose waiting work may go on now
-- (work joined, or a slot was freed), with the same scores; `cq:{key}`, a key's queue;
-- `cslots:{key}`, the ids holding its slots, each until its execution ended. A session's
-- turn is the key SESSION_GATE .. sid (one slot); a reasoner's limit, `limit:...`.

-- The key's waiting work may go on: claim.lua looks at it.
local function ready(key)
  local served = redis.call('ZSCORE', P .. 'ckeys', key)
  if served then redis.call('ZADD', P .. 'cready', served, key) end
end

-- id joins the tail of the key's queue (`cqueued` counts what the keys' queues hold).
local function wait_in(key, id)
  redis.call('RPUSH', P .. 'cq:' .. key, id)
  redis.call('INCR', P .. 'cqueued')
  redis.call('ZADD', P .. 'ckeys', 'NX', 0, key)
  ready(key)
end

-- id holds no slot of the key any more; an empty set is gone with its last member.
local function release(key, id)
  if redis.call('SREM', P .. 'cslots:' .. key, id) == 1 then ready(key) end
end

-- id left the key's queue before its turn (cancelled).
local function unqueue(key, id)
  if redis.call('LREM', P .. 'cq:' .. key, 0, id) == 0 then return end
  redis.call('DECR', P .. 'cqueued')
  if redis.call('EXISTS', P .. 'cq:' .. key) == 0 then
    redis.call('ZREM', P .. 'ckeys', key)
    redis.call('ZREM', P .. 'cready', key)
  else
    ready(key)  -- the one behind it may go on
  end
end

-- The requests for input a record keeps (ask.lua, answer.lua, expire.lua) go with its end:
-- no answer outlives its execution.
-- top: its `asked_top`, when the caller read it already.
local function drop_requests(rec, top)
  top = tonumber(top or redis.call('HGET', rec, 'asked_top') or '0') or 0
  local names = {}
  for i = 1, top do
    for j, prefix in ipairs(PER_REQUEST) do names[j] = prefix .. i end
    redis.call('HDEL', rec, unpack(names))
  end
  if top > 0 then redis.call('HDEL', rec, unpack(REQUESTS_KEPT)) end
end

-- The record has just become terminal: move it between indexes, start its TTL, notify.
-- owned: its owner's `owned:{replica}` set, false when nobody owned it (it was queued).
-- size: the bytes of its result and error, when the caller knows them (end.lua wrote them);
-- its input's are added here.
-- r: what it needs of the record, FINISH_READS' values (its tenant, its requests, its
-- concurrency key, its webhook), when the caller read them with its own; else one read here.
local function finish(rec, ev, id, sid, owned, size, r)
  r = r or redis.call('HMGET', rec, unpack(FINISH_READS))
  local tenant, ckey = r[1] or '', r[3]
  drop_requests(rec, r[2] or '0')
  redis.call('ZREM', RUNNING, id)
  if owned then redis.call('SREM', owned, id) end
  -- Its slots are free: its limit's, and its session's turn (any execution of the session
  -- may hold it, a gated start's or not).
  if ckey and ckey ~= '' then release(ckey, id) end
  if sid and sid ~= '' then release(SESSION_GATE .. scoped(tenant, sid), id) end
  -- Strictly increasing scores (us), so trimming drops exactly the oldest ends even when
  -- several are written in the same microsecond.
  if LAST == nil then
    local top = redis.call('ZREVRANGE', FINISHED, 0, 0, 'WITHSCORES')
    LAST = tonumber(top[2] or '0')
  end
  local score = NOW_US
  if LAST >= score then score = LAST + 1 end
  LAST = score
  redis.call('ZADD', FINISHED, score, member(id, tenant, sid or ''))
  -- What it keeps of its own counts against max_retained_bytes: its input too.
  size = (size or redis.call('HSTRLEN', rec, 'result') + redis.call('HSTRLEN', rec, 'error'))
    + redis.call('HSTRLEN', rec, 'body')
  redis.call('HSET', SIZES, id, size)
  redis.call('HINCRBY', SIZES, '#', size)
  redis.call('PEXPIRE', rec, TTL)
  redis.call('PEXPIRE', ev, TTL)
  if r[4] then
    schedule_webhook(P .. 'webhooks', P .. 'webhook_bodies', rec, id .. '.finished',
      'execution.finished')
  end
  if PRUNE then prune() end
  if NOTIFY then redis.call('PUBLISH', P .. 'ends', id) end
end

-- End a queued or parked execution (nobody runs it; `found`, its status) as cancelled: out
-- of the queue, or out of `scheduled` (named from the prefix) if it waited for a time.
local function cancel_queued(rec, ev, id, sid, reason, found)
  -- Its duration runs from its creation, across attempts, as a finished attempt's does.
  local since = tonumber(redis.call('HGET', rec, 'created_at')) or NOW / 1000
  move(rec, MOVE_CANCEL_QUEUED, found, STATUS_CANCELLED, 'status_reason', reason,
    'finished_at', string.format('%.6f', NOW / 1000),
    'duration_seconds', string.format('%.6f', math.max(0, NOW / 1000 - since)))
  redis.call('LREM', QUEUE, 0, id)
  redis.call('ZREM', P .. 'scheduled', id)
  for _, key in ipairs(redis.call('HMGET', rec, 'skey', 'ckey')) do
    if key and key ~= '' then unqueue(key, id) end
  end
  finish(rec, ev, id, sid, false)
end

