--[[ get
  KEYS: none (header.lua). ARGV[1..4]: the common arguments (header.lua).
  ARGV[5..]: ids. One entry per id: read(id).
]]
--! include judge.lua
local out = {}
for i = 5, #ARGV do out[#out + 1] = read(ARGV[i]) end
return out
