--[[ webhook_claim
  KEYS[1..2]: `webhooks` (delivery id -> when due, Redis ms), `webhook_bodies` (delivery
  id -> its body, webhooks.lua). ARGV[1..3]: the common arguments (header.lua).
  Claim the deliveries due now, oldest first. ARGV[4..]: the lease (ms), at most this many.
  Each claimed delivery is due again a lease later: a replica that dies while delivering
  leaves it to whichever replica claims it next (webhook_settle.lua ends or reschedules it).
  Returns {deliveries pending, Redis's clock (ms), {delivery id, body}...}.
]]
--! include header.lua
local due, bodies = KEYS[1], KEYS[2]
local lease, limit = tonumber(ARGV[4]), tonumber(ARGV[5])
local out = {redis.call('ZCARD', due), NOW}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', NOW, 'LIMIT', 0, limit)) do
  local body = redis.call('HGET', bodies, id)
  if body then
    redis.call('ZADD', due, NOW + lease, id)
    out[#out + 1] = {id, body}
  else
    redis.call('ZREM', due, id)
  end
end
return out
