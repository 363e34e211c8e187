--[[ emit
  KEYS[1..2]: the record (`x:{id}`) and its events (`ev:{id}`). ARGV[1..3]: the common
  arguments (header.lua).
  An event (its notice is published once per batch by the outbox's writer), written only
  while this attempt owns the execution, or has parked it and nobody resumed it yet (a
  stale attempt's events are dropped). ARGV[4..]:
  owner, attempt, event number, name, data (JSON), events kept.
]]
--! include header.lua
local v = redis.call('HMGET', KEYS[1], 'status', 'replica', 'attempt', 'parked_by')
-- Or parked by this attempt (ask.lua): the events it emitted before it parked.
local parked_here = v[1] == STATUS_INPUT_REQUIRED and v[4] == ARGV[4] .. '|' .. ARGV[5]
if not parked_here and (not OWNED[v[1]] or v[2] ~= ARGV[4] or v[3] ~= ARGV[5]) then
  return {1, 'dropped'}
end
local key = KEYS[2]
local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
if last[1] and tonumber(string.match(last[1][1], '^(%d+)')) >= tonumber(ARGV[6]) then
  return {1, 'dropped'}
end
redis.call('XADD', key, 'MAXLEN', ARGV[9], ARGV[6] .. '-1', 'e', ARGV[7], 'd', ARGV[8])
return {1, ''}
