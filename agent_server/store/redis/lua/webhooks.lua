--[[ webhooks: a webhook delivery, recorded in the script that makes the move it reports.
  KEYS: none of its own (each caller passes `webhooks` and `webhook_bodies`, or names them
  from the tagged prefix, as records.lua does).
  Defines: schedule_webhook(due, bodies, rec, delivery_id, kind, attempt): when the record
  has a `webhook` URL (given at its start), the delivery is due now in `due` (a sorted set:
  delivery id -> when it is due, Redis ms) and its body is kept in `bodies` (a hash:
  delivery id -> JSON {type, url, at (Redis ms), attempts, row, trace, attempt}), `row` the
  record as it is now (F's order), `trace` its trace context ('' if none) and `attempt`
  the attempt whose move it reports (the record's own when nil; a parked ask passes the
  asking one, the record's being bumped). Any replica delivers it (webhook_claim.lua,
  webhook_settle.lua).
]]
--! include header.lua
local function schedule_webhook(due, bodies, rec, delivery_id, kind, attempt)
  local url = redis.call('HGET', rec, 'webhook')
  if not url then return end
  local row = redis.call('HMGET', rec, unpack(F))
  local trace = redis.call('HGET', rec, 'trace') or ''
  redis.call('HSET', bodies, delivery_id, cjson.encode({type = kind, url = url, at = NOW,
    attempts = 0, row = row, trace = trace, attempt = attempt or redis.call('HGET', rec, 'attempt')}))
  redis.call('ZADD', due, NOW, delivery_id)
end
