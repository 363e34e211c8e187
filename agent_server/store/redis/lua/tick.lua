--[[ tick
  KEYS[1..8]: judge.lua's; KEYS[9..11]: `parked`, `versions`, `vqs`. The `owned:{replica}`
  sets of dead replicas, and the keys of the ids found there, are named from the prefix.
  ARGV[1..3]: the common arguments (header.lua).
  Renew this replica's liveness, count the live ones, move the running work of dead
  replicas to lost (bounded, only when judged() allows), prune. ARGV[4..]: lease (ms),
  sweep limit, how many executions this replica runs a task for, its versions (versions.py
  `advert`), '1' while it admits work (its versions are advertised) else '0' (withdrawn;
  the claimers are told at once, since work may have waited for them).
  Returns the cancel requests kept for this replica (`cancels:{replica}`, named from the
  prefix; cancel.lua writes them beside the PUBLISH, so one the subscriber missed still
  arrives here) while their execution is still its own, and drops the others.
  Returns {replicas alive, queued executions (1 more while work waits for a version, so
  the taker looks again: a version's last replica may have gone), 1 when this replica's `owned` set holds
  fewer ids than it runs tasks for (records may have vanished: Redis lost its data) else
  0, {cancel requests (JSON text)...}, records moved...}.
]]
--! include judge.lua
local lease, budget, tasks = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
-- Renewals: `renewals` holds "last|since|lease" per replica (Redis ms), `since` the first
-- renewal of the current unbroken run (no gap over half the lease); judged() reads it.
local since = NOW
local r = redis.call('HGET', RENEWALS, ME)
if r then
  local last, first = string.match(r, '^(%d+)|(%d+)|')
  if last and NOW - tonumber(last) <= lease / 2 then since = tonumber(first) end
end
redis.call('HSET', RENEWALS, ME, NOW .. '|' .. since .. '|' .. lease)
redis.call('ZADD', REPLICAS, NOW + lease, ME)
if ARGV[8] == '1' then
  redis.call('HSET', KEYS[10], ME, ARGV[7])
elseif redis.call('HDEL', KEYS[10], ME) == 1 and redis.call('SCARD', KEYS[11]) > 0 then
  redis.call('PUBLISH', P .. 'queued', '')  -- work waiting for this replica looks again
end
-- Kept until the execution leaves this replica (ended, handed off, judged), so a reply
-- lost on the way (a timeout) loses no request: the replica delivers each once.
local mine = P .. 'cancels:' .. ME
local cancels = {}
local kept = redis.call('HGETALL', mine)
for i = 1, #kept, 2 do
  local w = redis.call('HMGET', P .. 'x:' .. kept[i], 'status', 'replica')
  if OWNED[w[1] or ''] and w[2] == ME then
    cancels[#cancels + 1] = kept[i + 1]
  else
    redis.call('HDEL', mine, kept[i])
  end
end
local vanished = 0
if redis.call('SCARD', P .. 'owned:' .. ME) < tasks then vanished = 1 end
local out = {redis.call('ZCOUNT', REPLICAS, '(' .. NOW, '+inf'),
  redis.call('LLEN', QUEUE) + math.min(1, redis.call('SCARD', KEYS[11])), vanished, cancels}
local dead = redis.call('ZRANGEBYSCORE', REPLICAS, '-inf', NOW, 'LIMIT', 0, 10)
for _, replica in ipairs(dead) do
  local owned = P .. 'owned:' .. replica
  if budget > 0 and judged(replica) then
    for _, id in ipairs(redis.call('SRANDMEMBER', owned, budget)) do
      local v = read(id)
      if v and v[I_MOVED] == MOVED_LOST then out[#out + 1] = v end
      if (not v) or not OWNED[v[I_STATUS]] then redis.call('SREM', owned, id) end
      budget = budget - 1
    end
  end
  if redis.call('SCARD', owned) == 0 then
    redis.call('ZREM', REPLICAS, replica)
    redis.call('HDEL', RENEWALS, replica)
    redis.call('HDEL', KEYS[10], replica)
    redis.call('DEL', P .. 'cancels:' .. replica)
  end
end
local waiting = KEYS[9]  -- `parked`
for _, id in ipairs(redis.call('ZRANGEBYSCORE', waiting, '-inf', NOW, 'LIMIT', 0, 100)) do
  redis.call('ZREM', waiting, id)
  local rec = P .. 'x:' .. id
  local w = redis.call('HMGET', rec, 'status', 'replica', 'asking')
  if parked(w[1], w[2]) and w[3] and w[3] ~= '' then
    to_queued(rec, id, MOVE_EXPIRE, w[1], QUEUE, false, P .. 'queued', 'expired:' .. w[3], '1')
  end
end
prune()
return out
