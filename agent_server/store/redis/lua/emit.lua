--[[ emit
  KEYS: none (header.lua). ARGV[1..4]: the common arguments (header.lua).
  An event (its notice is published once per batch by the outbox's writer), written only
  while this attempt owns the execution (a stale attempt's events
  are dropped). ARGV[5..]: id, owner, attempt, event number, name, data (JSON), events kept.
]]
--! include header.lua
local id = ARGV[5]
local v = redis.call('HMGET', P .. 'x:' .. id, 'status', 'replica', 'attempt')
if v[1] ~= STATUS_RUNNING or v[2] ~= ARGV[6] or v[3] ~= ARGV[7] then return {1, 'dropped'} end
local key = P .. 'ev:' .. id
local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
if last[1] and tonumber(string.match(last[1][1], '^(%d+)')) >= tonumber(ARGV[8]) then
  return {1, 'dropped'}
end
redis.call('XADD', key, 'MAXLEN', ARGV[11], ARGV[8] .. '-1', 'e', ARGV[9], 'd', ARGV[10])
return {1, ''}
