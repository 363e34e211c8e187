--[[ cancel_queued
  KEYS: none (header.lua). ARGV[1..4]: the common arguments (header.lua).
  Cancel a queued execution: nobody runs it, so it ends here. ARGV[5..]: id, reason.
  Returns {1, ''} cancelled; {0, owner} when a replica claimed it meanwhile (send it there);
  {0, ''} when it is no longer active.
]]
--! include records.lua
local rec = P .. 'x:' .. ARGV[5]
local v = redis.call('HMGET', rec, 'status', 'replica', 'session_id')
if v[1] == STATUS_QUEUED then
  cancel_queued(rec, ARGV[5], v[3], ARGV[6])
  return {1, ''}
end
if v[1] == STATUS_RUNNING then return {0, v[2]} end
return {0, ''}
