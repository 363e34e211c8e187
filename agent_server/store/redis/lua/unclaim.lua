--[[ unclaim: an execution this replica took whose answer it never got (a claim, or a
  create, sent and unanswered in time, then run by Redis all the same), so its body never
  started here: back to the head of the queue with its attempt unchanged, for that
  attempt's first run on whichever replica takes it (section 12: accepted work is never
  failed unrun).
  KEYS[1..5]: the record (`x:{id}`), `running`, `owned:{owner}`, `queue`, the `queued`
  channel. ARGV[1..3]: the common arguments (header.lua).
  ARGV[4..]: id, owner, attempt, the take's token (a claim's, or a create's: each opens
  with its process's incarnation; '' for a record written without one), the request's
  body (JSON; '' to keep the record's).
  Fenced: only while it is running under that owner and attempt, taken by that claim.
  Returns {1|0, the status found ('' if unknown)}; 1 too when written already (the outbox
  writes again what it is not sure reached Redis).
]]
--! include moves.lua
local id, owner, attempt, token, body = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local rec = KEYS[1]
local v, fenced_in = taken(rec, owner, attempt, token)
if not v[1] then return {0, ''} end
if not fenced_in then
  if v[1] == STATUS_QUEUED and v[3] == attempt and v[2] == '' then return {1, v[1]} end
  return {0, v[1]}
end
if body ~= '' then redis.call('HSET', rec, 'body', body) end
redis.call('ZREM', KEYS[2], id)
redis.call('SREM', KEYS[3], id)
to_queued(rec, id, MOVE_REQUEUE, v[1], KEYS[4], true, KEYS[5])  -- at the head: never run
return {1, STATUS_RUNNING}
