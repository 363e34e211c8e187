--[[ tick
  KEYS: none (header.lua). ARGV[1..4]: the common arguments (header.lua).
  Renew this replica's liveness, count the live ones, move the running work of dead
  replicas to lost (bounded, only when judged() allows), prune. ARGV[5..]: lease (ms),
  sweep limit.
  Returns {replicas alive, queued executions, records moved...}.
]]
--! include judge.lua
local lease, budget = tonumber(ARGV[5]), tonumber(ARGV[6])
-- Renewals: `renewals` holds "last|since|lease" per replica (Redis ms), `since` the first
-- renewal of the current unbroken run (no gap over half the lease); judged() reads it.
local since = NOW
local r = redis.call('HGET', P .. 'renewals', ME)
if r then
  local last, first = string.match(r, '^(%d+)|(%d+)|')
  if last and NOW - tonumber(last) <= lease / 2 then since = tonumber(first) end
end
redis.call('HSET', P .. 'renewals', ME, NOW .. '|' .. since .. '|' .. lease)
redis.call('ZADD', P .. 'replicas', NOW + lease, ME)
local out = {redis.call('ZCOUNT', P .. 'replicas', '(' .. NOW, '+inf'),
  redis.call('LLEN', P .. 'queue')}
local dead = redis.call('ZRANGEBYSCORE', P .. 'replicas', '-inf', NOW, 'LIMIT', 0, 10)
for _, replica in ipairs(dead) do
  local owned = P .. 'owned:' .. replica
  if budget > 0 and judged(replica) then
    for _, id in ipairs(redis.call('SRANDMEMBER', owned, budget)) do
      local v = read(id)
      if v and v[I_MOVED] == MOVED_LOST then out[#out + 1] = v end
      if (not v) or v[I_STATUS] ~= STATUS_RUNNING then redis.call('SREM', owned, id) end
      budget = budget - 1
    end
  end
  if redis.call('SCARD', owned) == 0 then
    redis.call('ZREM', P .. 'replicas', replica)
    redis.call('HDEL', P .. 'renewals', replica)
  end
end
prune()
return out
