--[[ webhooks: a webhook delivery, recorded in the script that makes the move it reports.
  KEYS: none of its own (each caller passes `webhooks` and `webhook_bodies`, or names them
  from the tagged prefix, as records.lua does).
  Defines: schedule_webhook(due, bodies, rec, delivery_id, kind): when the record has a
  `webhook` URL (given at its start), the delivery is due now in `due` (a sorted set:
  delivery id -> when it is due, Redis ms) and its body is kept in `bodies` (a hash:
  delivery id -> JSON {type, url, at (Redis ms), attempts, row}), `row` the record as it
  is now (F's order). Any replica delivers it (webhook_claim.lua, webhook_settle.lua).
]]
--! include header.lua
local function schedule_webhook(due, bodies, rec, delivery_id, kind)
  local url = redis.call('HGET', rec, 'webhook')
  if not url then return end
  local row = redis.call('HMGET', rec, unpack(F))
  redis.call('HSET', bodies, delivery_id,
    cjson.encode({type = kind, url = url, at = NOW, attempts = 0, row = row}))
  redis.call('ZADD', due, NOW, delivery_id)
end
