--[[ enqueue: a new record, queued for whichever replica takes it first (a delayed start, or
  a start past --max-inflight with --queue-when-full), unless something forbids it.
  KEYS[1..8]: judge.lua's; KEYS[9..12]: the record (`x:{id}`), `idem:{idempotency key}`,
  `session:{sid}`, `releasing:{sid}` (the last three untouched when there is no key, no
  session); KEYS[13..15]: `scheduled`, `ckeys`, `tenant:{tenant}` (untouched when it has
  none). The session and the key are its tenant's names (names.py `scoped`). The keys of
  the execution a key was first used for, and its concurrency key's queue (`cq:{key}`),
  are named from the prefix.
  ARGV[1..3]: the common arguments (header.lua).
  ARGV[4..]: id, session id ('' for none), created_at, idempotency key ('' for none), its
  fingerprint, its TTL (ms), the delay (ms; 0: due now), the most executions that may be
  queued, its concurrency key ('' for none) and that key's limit, its session policy ('' for
  parallel), then the record's values in F's order, then any more field/value pairs (its
  body and max_attempts).
  A session policy looks at the session's active executions (at most 1000, newest first):
  `reject` refuses the start when there is one; `enqueue`, `interrupt` and `rollback` wait
  for the session's turn (the key SESSION_GATE .. sid, one slot, the record's `skey`): the
  start joins the tail of that key's queue whatever its delay (its place in the session's
  order is kept from now), and the active executions that are not themselves waiting in
  that queue hold its slot (`cslots:{key}`), so it starts once they ended; `interrupt` and
  `rollback` return them all to cancel. Otherwise, due now, it joins the tail of `queue`, or
  of its limit's queue (records.lua wait_in: `cq:{key}`, `ckeys`, `cready`; `cqueued` counts
  what the keys' queues hold, for the bound). Delayed, it is in `scheduled` too, scored by
  its due time on Redis's clock (claim.lua moves it on once due). The id is published on
  `queued`.
  Returns (codes.py `Create`): {CREATED, scheduled_at ('' when due now), ids to interrupt...};
  {BUSY, the id of an active execution of the session} (reject); {RELEASING};
  {KEY_MISMATCH}; {KEY_FORGOTTEN}; {FULL} as many are queued as may be; {EXISTING,
  record} the execution the key was first used for (nothing created).
]]
--! include admit.lua
local id, sid, score = ARGV[4], ARGV[5], ARGV[6]
local key, fingerprint, key_ttl = ARGV[7], ARGV[8], ARGV[9]
local delay, most = tonumber(ARGV[10]), tonumber(ARGV[11])
local ckey, climit, policy = ARGV[12], ARGV[13], ARGV[14]
local rec, idem, session, releasing, scheduled = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local ckeys = KEYS[14]
created(MOVE_ENQUEUE, ARGV[14 + I_STATUS])
local refused = refusal(sid, releasing, key, idem, fingerprint)
if refused then return refused end
local skey = ''
if sid ~= '' and (policy == 'enqueue' or policy == 'interrupt' or policy == 'rollback') then
  skey = SESSION_GATE .. sid
end
local interrupted = {}
if policy ~= '' and sid ~= '' then
  for _, other in ipairs(redis.call('ZREVRANGE', session, 0, 999)) do
    local status = redis.call('HGET', P .. 'x:' .. other, 'status')
    if status and ACTIVE[status] then
      if policy == 'reject' then return {CREATE_BUSY, other} end
      interrupted[#interrupted + 1] = other
    end
  end
end
local waiting = tonumber(redis.call('GET', P .. 'cqueued') or '0')  -- in the keys' queues
if redis.call('LLEN', QUEUE) + redis.call('ZCARD', scheduled) + waiting >= most then
  return {CREATE_FULL}
end
if key ~= '' then redis.call('SET', idem, fingerprint .. '|' .. id, 'PX', key_ttl) end
local values = {}
for i, f in ipairs(F) do values[2 * i - 1] = f; values[2 * i] = ARGV[14 + i] end
for i = 15 + #F, #ARGV do values[#values + 1] = ARGV[i] end
if ckey ~= '' then
  values[#values + 1] = 'ckey'; values[#values + 1] = ckey
  values[#values + 1] = 'climit'; values[#values + 1] = climit
end
if skey ~= '' then values[#values + 1] = 'skey'; values[#values + 1] = skey end
local at = ''
if delay > 0 then
  local due = NOW + delay
  at = string.format('%.6f', due / 1000)
  values[#values + 1] = 'scheduled_at'
  values[#values + 1] = at
  redis.call('ZADD', scheduled, due, id)
elseif skey == '' and ckey ~= '' then
  wait_in(ckey, id)
elseif skey == '' then
  redis.call('RPUSH', QUEUE, id)
end
redis.call('HSET', rec, unpack(values))
redis.call('ZADD', ALL, score, id)
if sid ~= '' then redis.call('ZADD', session, score, id) end
if ARGV[14 + I_TENANT] ~= '' then redis.call('ZADD', KEYS[15], score, id) end
if skey ~= '' then
  for _, other in ipairs(interrupted) do  -- it starts once they ended
    if redis.call('HGET', P .. 'x:' .. other, 'skey') ~= skey then
      redis.call('SADD', P .. 'cslots:' .. skey, other)
    end
  end
  wait_in(skey, id)
end
redis.call('PUBLISH', P .. 'queued', id)
local reply = {CREATE_CREATED, at}
if policy == 'interrupt' or policy == 'rollback' then
  for _, other in ipairs(interrupted) do reply[#reply + 1] = other end
end
return reply
