--[[ end_release
  KEYS[1..2]: `releasing:{session id}`, `released:{release id}`. ARGV[1..3]: the common
  arguments (header.lua).
  End a release: its answer for the releases that joined it (a minute), and the session free
  again if this release still holds it. ARGV[4..]: release id ('' none), answer ('' none).
]]
--! include header.lua
local key = KEYS[1]
if ARGV[4] ~= '' and ARGV[5] ~= '' then
  redis.call('SET', KEYS[2], ARGV[5], 'PX', 60000)
end
if ARGV[4] == '' or redis.call('GET', key) == ARGV[4] then redis.call('DEL', key) end
return 1
