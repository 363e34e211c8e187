--[[ claim
  KEYS[1..6]: records.lua's; KEYS[7..9]: `replicas`, `owned:{this replica}`, `scheduled`.
  The keys of the id it takes from the queue (its record, events, session) are named from
  the prefix.
  ARGV[1..3]: the common arguments (header.lua).
  Take the oldest queued execution, once what fell due in `scheduled` (on Redis's clock)
  joined the queue's tail. ARGV[4]: this replica. Returns {record, {body, checkpoint,
  max_attempts, last event id, the scheduled_at it waited for ('' if none)}}; else the ms
  until the next scheduled one is due, or false when nothing is queued at all.
]]
--! include records.lua
local me = ARGV[4]
local scheduled = KEYS[9]
local lease = redis.call('ZSCORE', KEYS[7], me)
if (not lease) or tonumber(lease) <= NOW then return false end  -- renew first, as create
local due = redis.call('ZRANGEBYSCORE', scheduled, '-inf', NOW, 'LIMIT', 0, 100)
if #due > 0 then
  redis.call('RPUSH', QUEUE, unpack(due))
  redis.call('ZREM', scheduled, unpack(due))
end
while true do
  local id = redis.call('LPOP', QUEUE)
  if not id then
    local soonest = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
    if soonest[2] then return math.max(0, tonumber(soonest[2]) - NOW) end
    return false
  end
  local rec, ev = P .. 'x:' .. id, P .. 'ev:' .. id
  local v = redis.call('HMGET', rec, 'status', 'created_at', 'session_id')
  if v[1] == STATUS_QUEUED and v[3] ~= '' and redis.call('EXISTS', P .. 'releasing:' .. v[3]) == 1 then
    cancel_queued(rec, ev, id, v[3], 'session_released')  -- its session is being released
  elseif v[1] == STATUS_QUEUED then
    redis.call('HSET', rec, 'status', STATUS_RUNNING, 'replica', me)
    redis.call('ZADD', RUNNING, v[2], id)
    redis.call('SADD', KEYS[8], id)
    local row = redis.call('HMGET', rec, unpack(F))
    row[I_MOVED] = MOVED_NOT
    local extra = redis.call('HMGET', rec, 'body', 'checkpoint', 'max_attempts', 'scheduled_at')
    local last = redis.call('XREVRANGE', ev, '+', '-', 'COUNT', 1)
    extra[5] = extra[4] or ''
    extra[4] = last[1] and last[1][1] or '0-0'
    if extra[5] ~= '' then
      redis.call('HSET', rec, 'scheduled_at', '')
      row[I_SCHEDULED_AT] = ''
    end
    return {row, extra}
  end
end
