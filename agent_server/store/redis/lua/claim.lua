--[[ claim
  KEYS[1..6]: records.lua's; KEYS[7..10]: `replicas`, `owned:{this replica}`, `scheduled`,
  `ckeys`. The keys of the id it takes (its record, events, session) and of a concurrency
  key (`cq:{key}`, its queue; `cslots:{key}`, the ids holding its slots) are named from the
  prefix.
  ARGV[1..3]: the common arguments (header.lua).
  Take the oldest queued execution, once what fell due in `scheduled` (on Redis's clock)
  joined the queue's tail. One whose reasoner has a concurrency limit (its record's `ckey`
  and `climit`) goes to the tail of its key's queue instead; the keys with waiting work
  (`ckeys`, scored by when each last got a slot) are then tried least recently served
  first, each taking its oldest while fewer than `climit` of the key's slots are held by
  running work (a holder that ended, or was lost, is dropped as it is seen); `cqueued`
  counts what the keys' queues hold. ARGV[4]: this
  replica; ARGV[5]: this claim's token, kept as the record's `claim` (a claim whose answer
  is lost is known by it: unclaim.lua). Returns {record, {body, checkpoint, max_attempts, last event id, the
  scheduled_at it waited for ('' if none), the requests asked by its checkpoint, trace
  context ('' for none)}}; else {ms until the next scheduled one is due (-1: none), 1 when
  keyed work waits for a slot (look again when one ends), else 0}.
]]
--! include records.lua
local me, token = ARGV[4], ARGV[5]
local scheduled, ckeys = KEYS[9], KEYS[10]
local lease = redis.call('ZSCORE', KEYS[7], me)
if (not lease) or tonumber(lease) <= NOW then return {-1, 0} end  -- renew first, as create
local due = redis.call('ZRANGEBYSCORE', scheduled, '-inf', NOW, 'LIMIT', 0, 100)
if #due > 0 then
  redis.call('RPUSH', QUEUE, unpack(due))
  redis.call('ZREM', scheduled, unpack(due))
end

-- Mark it running here and return it; nil (and cancelled) when its session is released.
local function take(id, v)
  local rec, ev = P .. 'x:' .. id, P .. 'ev:' .. id
  if v[3] ~= '' and redis.call('EXISTS', P .. 'releasing:' .. v[3]) == 1 then
    cancel_queued(rec, ev, id, v[3], 'session_released')  -- its session is being released
    return nil
  end
  redis.call('HSET', rec, 'status', STATUS_RUNNING, 'replica', me, 'claim', token)
  redis.call('ZADD', RUNNING, v[2], id)
  redis.call('SADD', KEYS[8], id)
  local row = redis.call('HMGET', rec, unpack(F))
  row[I_MOVED] = MOVED_NOT
  local extra = redis.call('HMGET', rec, 'body', 'checkpoint', 'max_attempts', 'scheduled_at')
  local last = redis.call('XREVRANGE', ev, '+', '-', 'COUNT', 1)
  extra[5] = extra[4] or ''
  extra[4] = last[1] and last[1][1] or '0-0'
  extra[6] = redis.call('HGET', rec, 'checkpoint_asks') or '0'
  extra[7] = redis.call('HGET', rec, 'trace') or ''
  if extra[5] ~= '' then
    redis.call('HSET', rec, 'scheduled_at', '')
    row[I_SCHEDULED_AT] = ''
  end
  return {row, extra}
end

while true do
  local id = redis.call('LPOP', QUEUE)
  if not id then break end
  local v = redis.call('HMGET', P .. 'x:' .. id, 'status', 'created_at', 'session_id', 'ckey')
  if v[1] == STATUS_QUEUED and v[4] and v[4] ~= '' then
    redis.call('RPUSH', P .. 'cq:' .. v[4], id)  -- it waits for a slot of its key
    redis.call('INCR', P .. 'cqueued')
    if not redis.call('ZSCORE', ckeys, v[4]) then redis.call('ZADD', ckeys, 0, v[4]) end
  elseif v[1] == STATUS_QUEUED then
    local claimed = take(id, v)
    if claimed then return claimed end
  end
end

local blocked = 0
for _, key in ipairs(redis.call('ZRANGE', ckeys, 0, 99)) do
  local queue, slots = P .. 'cq:' .. key, P .. 'cslots:' .. key
  for _, holder in ipairs(redis.call('SMEMBERS', slots)) do
    if not OWNED[redis.call('HGET', P .. 'x:' .. holder, 'status') or ''] then
      redis.call('SREM', slots, holder)
    end
  end
  while true do
    local id = redis.call('LINDEX', queue, 0)
    if not id then redis.call('ZREM', ckeys, key); break end
    local v = redis.call('HMGET', P .. 'x:' .. id, 'status', 'created_at', 'session_id',
      'climit')
    if v[1] ~= STATUS_QUEUED then
      redis.call('LPOP', queue)  -- ended meanwhile
      redis.call('DECR', P .. 'cqueued')
    elseif redis.call('SCARD', slots) >= (tonumber(v[4]) or 1) then
      blocked = 1
      break
    else
      redis.call('LPOP', queue)
      redis.call('DECR', P .. 'cqueued')
      local claimed = take(id, v)
      if claimed then
        redis.call('SADD', slots, id)
        redis.call('ZADD', ckeys, NOW_US, key)
        if redis.call('LLEN', queue) == 0 then redis.call('ZREM', ckeys, key) end
        return claimed
      end
    end
  end
end
local soonest = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
if soonest[2] then return {math.max(0, tonumber(soonest[2]) - NOW), blocked} end
return {-1, blocked}
