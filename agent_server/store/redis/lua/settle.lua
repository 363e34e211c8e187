--[[ settle
  KEYS[1..8]: judge.lua's; KEYS[9..]: per id, in ARGV's order, its record (`x:{id}`),
  events (`ev:{id}`) and `void:{id}`. ARGV[1..3]: the common arguments (header.lua).
  Settle creates whose answer this replica never got (sent, then no reply in time: Redis
  may still run them, section 12). ARGV[4..]: ids. Per id, the record (read()) if it was
  created; else false, and the id is voided so that a create still on its way is refused.
]]
--! include judge.lua
local out = {}
local k = 9
for i = 4, #ARGV do
  local v = read(ARGV[i], KEYS[k], KEYS[k + 1])
  if not v then redis.call('SET', KEYS[k + 2], '1', 'PX', 86400000) end
  out[#out + 1] = v
  k = k + 3
end
return out
