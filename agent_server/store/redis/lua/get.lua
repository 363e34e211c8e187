--[[ get
  KEYS[1..8]: judge.lua's; KEYS[9..]: per id, in ARGV's order, its record (`x:{id}`) and
  events (`ev:{id}`). ARGV[1..3]: the common arguments (header.lua).
  ARGV[4..]: ids. One entry per id: read(id).
]]
--! include judge.lua
local out = {}
local k = 9
for i = 4, #ARGV do
  out[#out + 1] = read(ARGV[i], KEYS[k], KEYS[k + 1])
  k = k + 2
end
return out
