--[[ settle
  KEYS: none (header.lua). ARGV[1..4]: the common arguments (header.lua).
  Settle creates whose answer this replica never got (sent, then no reply in time: Redis
  may still run them, section 12). ARGV[5..]: ids. Per id, the record (read()) if it was
  created; else false, and the id is voided so that a create still on its way is refused.
]]
--! include judge.lua
local out = {}
for i = 5, #ARGV do
  local v = read(ARGV[i])
  if not v then redis.call('SET', P .. 'void:' .. ARGV[i], '1', 'PX', 86400000) end
  out[#out + 1] = v
end
return out
