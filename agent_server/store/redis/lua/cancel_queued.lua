--[[ cancel_queued
  KEYS[1..6]: records.lua's; KEYS[7..9]: the record (`x:{id}`), its events (`ev:{id}`),
  `parked`. ARGV[1..3]: the common arguments (header.lua).
  Cancel a queued or a parked execution (input_required, nobody owns it): nobody runs it,
  so it ends here. ARGV[4..]: id, reason.
  Returns {1, ''} cancelled; {0, owner} when a replica claimed it meanwhile (send it there);
  {0, ''} when it is no longer active.
]]
--! include records.lua
local rec = KEYS[7]
local v = redis.call('HMGET', rec, 'status', 'replica', 'session_id')
if unowned(v[1], v[2]) then
  redis.call('ZREM', KEYS[9], ARGV[4])
  cancel_queued(rec, KEYS[8], ARGV[4], v[3], ARGV[5], v[1])
  return {1, ''}
end
if OWNED[v[1]] then return {0, v[2]} end
return {0, ''}
