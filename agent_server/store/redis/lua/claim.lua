--[[ claim
  KEYS[1..6]: records.lua's; KEYS[7..8]: `replicas`, `owned:{this replica}`. The keys of
  the id it takes from the queue (its record, events, session) are named from the prefix.
  ARGV[1..3]: the common arguments (header.lua).
  Take the oldest queued execution. ARGV[4]: this replica. Returns {record, {body,
  checkpoint, max_attempts, last event id, trace context ('' for none)}} or false when
  nothing is queued.
]]
--! include records.lua
local me = ARGV[4]
local lease = redis.call('ZSCORE', KEYS[7], me)
if (not lease) or tonumber(lease) <= NOW then return false end  -- renew first, as create
while true do
  local id = redis.call('LPOP', QUEUE)
  if not id then return false end
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
    local extra = redis.call('HMGET', rec, 'body', 'checkpoint', 'max_attempts')
    local last = redis.call('XREVRANGE', ev, '+', '-', 'COUNT', 1)
    extra[4] = last[1] and last[1][1] or '0-0'
    extra[5] = redis.call('HGET', rec, 'trace') or ''
    return {row, extra}
  end
end
