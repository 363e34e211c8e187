--[[ ask
  KEYS[1..4]: the record (`x:{id}`), the `ends` channel, `webhooks`, `webhook_bodies`
  (webhooks.lua: its `execution.input_required` delivery). ARGV[1..3]: the common arguments (header.lua).
  Its reasoner waits for input (ctx.ask), fenced by owner and attempt like a checkpoint.
  ARGV[4..]: owner, attempt, request id, the request (the record's `input_request`, JSON).
  Sets status input_required, input_request and `asking` (the pending request id), and
  publishes the id on `ends` (waiters that return at input_required re-read it).
  A request an earlier attempt had answered (`answer:{request id}` kept: the reasoner asks
  again after a hand-off or a retry) is not asked again: its answer is returned, and
  nothing changes.
  Returns {1, the status found} when recorded; {2, the kept answer (JSON)} when answered
  before; {0, the status found ('' if unknown)} when this attempt no longer owns it.
]]
--! include header.lua
--! include webhooks.lua
local rec = KEYS[1]
local v = redis.call('HMGET', rec, 'status', 'replica', 'attempt', 'execution_id')
if not v[1] then return {0, ''} end
if v[1] ~= STATUS_RUNNING or v[2] ~= ARGV[4] or v[3] ~= ARGV[5] then return {0, v[1]} end
local kept = redis.call('HGET', rec, 'answer:' .. ARGV[6])
if kept then return {2, kept} end
redis.call('HSET', rec, 'status', STATUS_INPUT_REQUIRED, 'input_request', ARGV[7],
  'asking', ARGV[6])
redis.call('PUBLISH', KEYS[2], v[4])
schedule_webhook(KEYS[3], KEYS[4], rec, v[4] .. '.input.' .. ARGV[5] .. '.' .. ARGV[6],
  'execution.input_required')
return {1, v[1]}
