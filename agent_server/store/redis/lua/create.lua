--[[ create: a new record, running under its owner, unless something forbids it.
  KEYS[1..8]: judge.lua's; KEYS[9..14]: the record (`x:{id}`), `void:{id}:{token}` (this
  create's take, its `claim` among the pairs below),
  `idem:{idempotency key}`, `session:{sid}`, `owned:{owner}`, `releasing:{sid}` (the last
  four untouched when there is no key, no session), KEYS[15]: `tenant:{tenant}` (untouched
  when it has none). The session and the key are its tenant's names (names.py `scoped`).
  The keys of the execution a key was first used for are named from the prefix (its id is
  read here).
  ARGV[1..3]: the common arguments (header.lua).
  ARGV[4..]: id, session id ('' for none), created_at, owner, idempotency key ('' for
  none), its fingerprint, its TTL (ms), then the record's values in F's order, then any more
  field/value pairs (`claim`: the take's token; a resumable one's body and max_attempts).
  Returns (codes.py `Create`): {CREATED}; {RELEASING} the session is being released;
  {KEY_MISMATCH} the key was used for another request; {KEY_FORGOTTEN} the key's execution
  was forgotten; {VOIDED} its creator gave up on this create (settle.lua); {LEASE_LAPSED} the
  owner must renew first; {EXISTING, record} the execution the key was first used for
  (nothing created).
]]
--! include admit.lua
local id, sid, score, owner = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local key, fingerprint, key_ttl = ARGV[8], ARGV[9], ARGV[10]
local rec, void, idem, session, owned, releasing = KEYS[9], KEYS[10], KEYS[11], KEYS[12],
  KEYS[13], KEYS[14]
created(MOVE_START, ARGV[10 + I_STATUS])
-- Its creator gave up on this create (no answer in time) and found it absent: it stays
-- absent. Another create of the id (a firing tried again) is not this one.
if redis.call('EXISTS', void) == 1 then return {CREATE_VOIDED} end
-- An owner whose lease lapsed (paused past it: its work is being judged) takes no new work
-- until it has renewed; what it took now would be judged at once.
local lease = redis.call('ZSCORE', REPLICAS, owner)
if (not lease) or tonumber(lease) <= NOW then return {CREATE_LEASE_LAPSED} end
local refused = refusal(sid, releasing, key, idem, fingerprint)
if refused then return refused end
if key ~= '' then redis.call('SET', idem, fingerprint .. '|' .. id, 'PX', key_ttl) end
local values = {}
for i, f in ipairs(F) do values[2 * i - 1] = f; values[2 * i] = ARGV[10 + i] end
for i = 11 + #F, #ARGV do values[#values + 1] = ARGV[i] end
redis.call('HSET', rec, unpack(values))
redis.call('ZADD', ALL, score, id)
redis.call('ZADD', RUNNING, score, id)
redis.call('SADD', owned, id)
if sid ~= '' then redis.call('ZADD', session, score, id) end
if ARGV[10 + I_TENANT] ~= '' then redis.call('ZADD', KEYS[15], score, id) end
return {CREATE_CREATED}
