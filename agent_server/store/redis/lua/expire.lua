--[[ expire
  KEYS[1]: the record (`x:{id}`). ARGV[1..3]: the common arguments (header.lua).
  A request timed out on its owner (or the owner looks again after a missed notice, with
  ARGV[7] '0'): close it unless an answer was taken first. ARGV[4..]: owner, attempt,
  request id, '1' to close it ('0' only to look).
  Closing keeps `expired:{request id}`: a later attempt that asks it again times out at
  once, as this one did.
  Returns {1} closed unanswered (status running again); {2, the answer (JSON)} answered
  first; {0, the status found ('' if unknown)} still waiting (looking only), or this attempt
  no longer owns it.
]]
--! include moves.lua
local rec = KEYS[1]
local v = redis.call('HMGET', rec, 'status', 'replica', 'attempt', 'asking',
  'answer:' .. ARGV[6])
if not v[1] then return {0, ''} end
if v[2] ~= ARGV[4] or v[3] ~= ARGV[5] then return {0, v[1]} end
if v[5] then return {2, v[5]} end
if v[1] == STATUS_INPUT_REQUIRED and v[4] == ARGV[6] and ARGV[7] == '1' then
  move(rec, MOVE_RESUME, v[1], STATUS_RUNNING, 'expired:' .. ARGV[6], '1')
  return {1}
end
return {0, v[1]}
