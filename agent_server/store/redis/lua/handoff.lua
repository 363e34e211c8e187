--[[ handoff
  KEYS: none (header.lua). ARGV[1..4]: the common arguments (header.lua).
  Hand-off at shutdown, fenced like an end. ARGV[5..]: id, owner, attempt. The next attempt
  is queued for whichever replica takes it first. Returns {1|0, the status found}.
]]
--! include header.lua
local id, owner, attempt = ARGV[5], ARGV[6], ARGV[7]
local rec = P .. 'x:' .. id
local v = redis.call('HMGET', rec, 'status', 'replica', 'attempt')
if not v[1] then return {0, ''} end
if v[1] ~= STATUS_RUNNING or v[2] ~= owner or v[3] ~= attempt then
  if v[1] == STATUS_QUEUED and v[3] == tostring(tonumber(attempt) + 1) then return {1, v[1]} end
  return {0, v[1]}
end
redis.call('HSET', rec, 'status', STATUS_QUEUED, 'attempt', tostring(tonumber(attempt) + 1),
  'replica', '')
redis.call('ZREM', P .. 'running', id)
redis.call('SREM', P .. 'owned:' .. owner, id)
redis.call('RPUSH', P .. 'queue', id)
redis.call('PUBLISH', P .. 'queued', id)
return {1, STATUS_RUNNING}
