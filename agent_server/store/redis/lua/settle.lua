--[[ settle
  KEYS[1..8]: judge.lua's; KEYS[9..]: per create, in ARGV's order, its record (`x:{id}`),
  events (`ev:{id}`) and `void:{id}:{token}`. ARGV[1..3]: the common arguments (header.lua).
  Settle creates whose answer this replica never got (sent, then no reply in time: Redis
  may still run them, section 12). ARGV[4..]: per create, its id and its take's token (the
  `claim` create.lua writes). Returns per create the record (read()) if that create made
  it; else false, and that create is voided: should it run yet, create.lua refuses it.
  A void names the take, not the id: a schedule's firing tried again is a new create of the
  same id (and the same idempotency key), which must not be refused for a day.
]]
--! include judge.lua
local out = {}
local k = 9
for i = 4, #ARGV, 2 do
  local v = read(ARGV[i], KEYS[k], KEYS[k + 1])
  -- Made by another create of the id (a firing's retry): not this one's to run.
  if v and redis.call('HGET', KEYS[k], 'claim') ~= ARGV[i + 1] then v = false end
  if not v then redis.call('SET', KEYS[k + 2], '1', 'PX', 86400000) end
  out[#out + 1] = v
  k = k + 3
end
return out
