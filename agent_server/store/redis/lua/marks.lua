--[[ marks
  KEYS[1]: a schedule's marks (`schedule:{key}`, a hash: created, handled, started, timing).
  ARGV[1..3]: the common arguments (header.lua).
  ARGV[4]: a time (a float's repr) for `created` if it holds none yet, '' to leave it.
  ARGV[5]: the timing (cron and zone) of the caller's schedule, '' to leave it. The marks
  keep the timing their `handled` belongs to: a caller with another one (the cron changed,
  by a PATCH or by a release) moves `handled` on to ARGV[4], its now, so nothing of the
  new cron from before the change runs; marks with no timing yet just take it.
  ARGV[6]: a fire time, '' for none; ARGV[7..]: the marks to move on to it ('handled',
  'started'), each written only when it holds no time or an earlier one: a mark never goes
  back, whichever replica's write comes last.
  Returns created, handled and started as the hash holds them now (nil for none).
]]
--! include header.lua
local key, created, timing, at = KEYS[1], ARGV[4], ARGV[5], ARGV[6]
if created ~= '' then
  redis.call('HSETNX', key, 'created', created)
end
if timing ~= '' then
  local kept = redis.call('HGET', key, 'timing')
  if kept ~= timing then
    redis.call('HSET', key, 'timing', timing)
    local handled = redis.call('HGET', key, 'handled')
    if kept and created ~= '' and (not handled or tonumber(handled) < tonumber(created)) then
      redis.call('HSET', key, 'handled', created)
    end
  end
end
if at ~= '' then
  local time = tonumber(at)
  for i = 7, #ARGV do
    local kept = redis.call('HGET', key, ARGV[i])
    if not kept or tonumber(kept) < time then
      redis.call('HSET', key, ARGV[i], at)
    end
  end
end
return redis.call('HMGET', key, 'created', 'handled', 'started')
