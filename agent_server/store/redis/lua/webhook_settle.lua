--[[ webhook_settle
  KEYS[1..2]: webhook_claim.lua's. ARGV[1..3]: the common arguments (header.lua).
  After an attempt at a delivery. ARGV[4..]: delivery id, then '' when it is over
  (delivered, given up or refused: it goes), else the delay (ms) before its next attempt
  (its body counts one attempt more). A delivery already gone stays gone.
  Returns the deliveries pending.
]]
--! include header.lua
local due, bodies = KEYS[1], KEYS[2]
local id, delay = ARGV[4], ARGV[5]
if delay == '' then
  redis.call('ZREM', due, id)
  redis.call('HDEL', bodies, id)
elseif redis.call('ZSCORE', due, id) then
  local body = cjson.decode(redis.call('HGET', bodies, id))
  body.attempts = body.attempts + 1
  redis.call('HSET', bodies, id, cjson.encode(body))
  redis.call('ZADD', due, NOW + tonumber(delay), id)
end
return redis.call('ZCARD', due)
