--[[ answer
  KEYS[1]: the record (`x:{id}`). The owner's channel (`cancel:{owner}`) is named from the
  prefix, KEYS[2], once the owner is read. ARGV[1..3]: the common arguments (header.lua).
  Take an answer, exactly once: only while the record is input_required and waits for that
  request. ARGV[4..]: request id, the value (JSON text, checked by the caller).
  Sets status running (the owner's task goes on), input_request null, keeps the answer as
  `answer:{request id}` (for the owner's timeout and a re-read after a missed notice), and
  publishes it to the owner: {"id", "request_id", "value"}.
  Returns {1, record (F's order)} taken; {0, the status found ('' if unknown), the pending
  request id ('' if none)} refused.
]]
--! include header.lua
local rec = KEYS[1]
local v = redis.call('HMGET', rec, 'status', 'asking', 'replica', 'execution_id')
if not v[1] then return {0, '', ''} end
if v[1] ~= STATUS_INPUT_REQUIRED or v[2] ~= ARGV[4] then return {0, v[1], v[2] or ''} end
redis.call('HSET', rec, 'status', STATUS_RUNNING, 'input_request', 'null', 'asking', '',
  'answer:' .. ARGV[4], ARGV[5])
redis.call('PUBLISH', KEYS[2] .. 'cancel:' .. v[3],
  '{"id":"' .. v[4] .. '","request_id":' .. ARGV[4] .. ',"value":' .. ARGV[5] .. '}')
local row = redis.call('HMGET', rec, unpack(F))
return {1, row}
