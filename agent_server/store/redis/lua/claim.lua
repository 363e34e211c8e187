--[[ claim
  KEYS: none (header.lua). ARGV[1..4]: the common arguments (header.lua).
  Take the oldest queued execution. ARGV[5]: this replica. Returns {record, {body,
  checkpoint, max_attempts}} or false when nothing is queued.
]]
--! include records.lua
local me = ARGV[5]
local lease = redis.call('ZSCORE', P .. 'replicas', me)
if (not lease) or tonumber(lease) <= NOW then return false end  -- renew first, as _CREATE
while true do
  local id = redis.call('LPOP', P .. 'queue')
  if not id then return false end
  local rec = P .. 'x:' .. id
  local v = redis.call('HMGET', rec, 'status', 'created_at', 'session_id')
  if v[1] == STATUS_QUEUED and v[3] ~= '' and redis.call('EXISTS', P .. 'releasing:' .. v[3]) == 1 then
    cancel_queued(rec, id, v[3], 'session_released')  -- its session is being released
  elseif v[1] == STATUS_QUEUED then
    redis.call('HSET', rec, 'status', STATUS_RUNNING, 'replica', me)
    redis.call('ZADD', P .. 'running', v[2], id)
    redis.call('SADD', P .. 'owned:' .. me, id)
    local row = redis.call('HMGET', rec, unpack(F))
    row[I_MOVED] = MOVED_NOT
    local extra = redis.call('HMGET', rec, 'body', 'checkpoint', 'max_attempts')
    local last = redis.call('XREVRANGE', P .. 'ev:' .. id, '+', '-', 'COUNT', 1)
    extra[4] = last[1] and last[1][1] or '0-0'
    return {row, extra}
  end
end
