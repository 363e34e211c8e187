--[[ cancel: a cancel request for the replica that owns a running execution (or one waiting
  for input in its task), recorded and published in one step.
  KEYS[1..2]: the record (`x:{id}`), the prefix (the owner's `cancels:{owner}` and its
  channel `cancel:{owner}` are named from it once the owner is read).
  ARGV[1..3]: the common arguments (header.lua). ARGV[4..]: id, the request (JSON text:
  {"id", "reason", "settle_within"}).
  The request is kept in `cancels:{owner}` (id -> request) as well as published: the
  owner's renewals (tick.lua) return it while the execution is still the owner's, so a
  cancel answered 202 reaches its owner whatever the subscriber's state. The hash expires
  a day after its last request (a dead owner's goes with its liveness entry sooner).
  Returns {1, owner} sent; {0, the status found ('' if unknown)} when nobody owns it.
]]
--! include moves.lua
local rec, prefix, id, request = KEYS[1], KEYS[2], ARGV[4], ARGV[5]
local v = redis.call('HMGET', rec, 'status', 'replica')
if not v[1] then return {0, ''} end
if not held(v[1], v[2]) then return {0, v[1]} end
local pending = prefix .. 'cancels:' .. v[2]
redis.call('HSET', pending, id, request)
redis.call('PEXPIRE', pending, 86400000)
redis.call('PUBLISH', prefix .. 'cancel:' .. v[2], request)
return {1, v[2]}
