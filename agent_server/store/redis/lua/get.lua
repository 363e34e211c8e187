--[[ get
  KEYS[1..8]: judge.lua's; KEYS[9..]: per id, in ARGV's order, its record (`x:{id}`) and
  events (`ev:{id}`). ARGV[1..3]: the common arguments (header.lua).
  ARGV[4]: '' for any tenant's record, else '=' followed by the one tenant whose records
  are read ('=' alone: those of no tenant). ARGV[5..]: ids.
  One entry per id: read(id), or false when unknown or another tenant's. The tenant is
  read first, alone: another tenant's record is never read whole (nor judged), so its id
  costs what an unknown one does, the same commands and the same reply.
]]
--! include judge.lua
local WANTED = ARGV[4]
local out = {}
local k = 9
for i = 5, #ARGV do
  local found = true
  if WANTED ~= '' then
    local t = redis.call('HMGET', KEYS[k], 'execution_id', 'tenant')
    found = t[1] and (t[2] or '') == string.sub(WANTED, 2)
  end
  out[#out + 1] = found and read(ARGV[i], KEYS[k], KEYS[k + 1])
  k = k + 2
end
return out
