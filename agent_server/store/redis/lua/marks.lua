--[[ marks
  KEYS[1]: a schedule's marks (`schedule:{key}`, a hash: created, handled, started).
  ARGV[1..3]: the common arguments (header.lua).
  ARGV[4]: a time (a float's repr) for `created` if it holds none yet, '' to leave it.
  ARGV[5]: a fire time, '' for none; ARGV[6..]: the marks to move on to it ('handled',
  'started'), each written only when it holds no time or an earlier one: a mark never goes
  back, whichever replica's write comes last.
  Returns created, handled and started as the hash holds them now (nil for none).
]]
--! include header.lua
local key, created, at = KEYS[1], ARGV[4], ARGV[5]
if created ~= '' then
  redis.call('HSETNX', key, 'created', created)
end
if at ~= '' then
  local time = tonumber(at)
  for i = 6, #ARGV do
    local kept = redis.call('HGET', key, ARGV[i])
    if not kept or tonumber(kept) < time then
      redis.call('HSET', key, ARGV[i], at)
    end
  end
end
return redis.call('HMGET', key, 'created', 'handled', 'started')
