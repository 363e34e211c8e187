--[[ forget: delete a finished record and its index entries.
  KEYS: none (header.lua). ARGV[1..4]: the common arguments (header.lua).
  ARGV[5]: the id.
  Returns (codes.py `Forget`): {UNKNOWN}; {ACTIVE, record} still running or queued (nothing
  deleted); {FORGOTTEN, record}.
]]
--! include judge.lua
local v = read(ARGV[5])
if not v then return {FORGET_UNKNOWN} end
if v[I_STATUS] == STATUS_RUNNING or v[I_STATUS] == STATUS_QUEUED then return {FORGET_ACTIVE, v} end
drop(ARGV[5] .. '|' .. v[I_SESSION_ID])
redis.call('ZREM', P .. 'running', ARGV[5])
return {FORGET_FORGOTTEN, v}
