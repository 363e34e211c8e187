--[[ forget: delete a finished record and its index entries.
  KEYS[1..8]: judge.lua's; KEYS[9..10]: the record (`x:{id}`) and its events (`ev:{id}`).
  Its session's index is named from the prefix (the session is read here).
  ARGV[1..3]: the common arguments (header.lua). ARGV[4]: the id.
  Returns (codes.py `Forget`): {UNKNOWN}; {ACTIVE, record} still running or queued (nothing
  deleted); {FORGOTTEN, record}.
]]
--! include judge.lua
local id = ARGV[4]
local v = read(id, KEYS[9], KEYS[10])
if not v then return {FORGET_UNKNOWN} end
if ACTIVE[v[I_STATUS]] then return {FORGET_ACTIVE, v} end
drop(member(id, v[I_TENANT], v[I_SESSION_ID]), KEYS[9], KEYS[10])
redis.call('ZREM', RUNNING, id)
return {FORGET_FORGOTTEN, v}
