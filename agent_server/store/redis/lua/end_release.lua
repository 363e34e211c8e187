--[[ end_release
  KEYS: none (header.lua). ARGV[1..4]: the common arguments (header.lua).
  End a release: its answer for the releases that joined it (a minute), and the session free
  again if this release still holds it. ARGV[5..]: session id, release id, answer ('' none).
]]
--! include header.lua
local key = P .. 'releasing:' .. ARGV[5]
if ARGV[6] ~= '' and ARGV[7] ~= '' then
  redis.call('SET', P .. 'released:' .. ARGV[6], ARGV[7], 'PX', 60000)
end
if ARGV[6] == '' or redis.call('GET', key) == ARGV[6] then redis.call('DEL', key) end
return 1
