--[[ checkpoint
  KEYS: none (header.lua). ARGV[1..4]: the common arguments (header.lua).
  A resumable execution's progress, fenced like an end. ARGV[5..]: id, owner, attempt,
  checkpoint (JSON). Returns {1|0, the status found ('' if unknown)}.
]]
--! include header.lua
local rec = P .. 'x:' .. ARGV[5]
local v = redis.call('HMGET', rec, 'status', 'replica', 'attempt')
if not v[1] then return {0, ''} end
if v[1] ~= STATUS_RUNNING or v[2] ~= ARGV[6] or v[3] ~= ARGV[7] then return {0, v[1]} end
redis.call('HSET', rec, 'checkpoint', ARGV[8])
return {1, v[1]}
