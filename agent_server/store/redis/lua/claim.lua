--[[ claim
  KEYS[1..6]: records.lua's; KEYS[7..12]: `replicas`, `owned:{this replica}`, `scheduled`,
  `ckeys`, `versions` (each live replica's versions, tick.lua), `vqs` (the names of the
  version queues that hold work). The keys of the id it takes (its record, events, session),
  of a concurrency key (`cq:{key}`, its queue; `cslots:{key}`, the ids holding its slots)
  of a version queue (`vq:{reasoner}\31{version}`: work whose checkpoint waits for a
  replica of that version) and of a reasoner's queue (`rq:{reasoner}`: work this replica
  has no code for, waiting for a live replica that serves it) are named from the prefix.
  ARGV[1..3]: the common arguments (header.lua).
  Take the oldest queued execution, once what fell due in `scheduled` (on Redis's clock)
  joined the queue's tail. One that waits for a key (records.lua: its session's turn, the
  record's `skey`, then a slot of its limit, `ckey` and `climit`) goes to the tail of that
  key's queue instead (a session's queue holds it since its start: it is now due); the keys
  whose work may go on (`cready`) are then tried least recently served first, each giving
  its oldest a slot while fewer than its limit are held by executions that have not ended;
  a key without a free slot leaves `cready` until a holder ends. `cqueued` counts what the
  keys' queues hold. ARGV[4]: this
  replica; ARGV[5]: this claim's token, kept as the record's `claim` (a claim whose answer
  is lost is known by it: unclaim.lua), and marked `unbegun` until its taker says the body
  begins (begin.lua; judge.lua requeues a dead owner's take still marked). ARGV[6]: this replica's versions (versions.py
  `advert`: every reasoner it serves, an unversioned one's version '').
  Versions (docs/durable.md): work for a reasoner this replica does not serve waits in its
  reasoner's queue while a live replica serves it (taken there first, by its claims), and
  is taken here (its taker fails it: nobody has its code) only once none does. Work with a
  checkpoint is taken when this replica reads its
  version (the same, `compatible`, or by `migrate`); else it waits in its version's queue
  while a live replica advertises that version (taken there first, by its claims), and
  once none does it is taken here for `on_version_change`: `restart` (attempt + 1, the
  checkpoint set aside, its requests for input dropped) or `fail` (the taker fails it).
  Returns {record, {body, checkpoint, max_attempts, last event id, the scheduled_at it
  waited for ('' if none), the requests asked by its checkpoint, trace context ('' for
  none), the version rule (versions.py `Rule`), the checkpoint's version}, executions set
  waiting for a version}; else {ms until the next scheduled one is due (or scripts.py
  `Unclaimed`: NONE_SCHEDULED, or LEASE_LAPSED: this replica's lease lapsed here), 1 when
  keyed work waits for a slot (look again when one ends), else 0, executions set waiting
  for a version}; the ms are 0 when keys are left to look at (more than one call looks at).
]]
--! include records.lua
local me, token = ARGV[4], ARGV[5]
local scheduled, ckeys, VERSIONS, VQS = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local lease = redis.call('ZSCORE', KEYS[7], me)
-- Not while this replica's lease has lapsed here (a paused replica, or a new primary that
-- last saw the lease long ago): it renews first, as create; never "nothing is due".
if (not lease) or tonumber(lease) <= NOW then return {UNCLAIMED_LEASE_LAPSED, 0, 0} end
local due = redis.call('ZRANGEBYSCORE', scheduled, '-inf', NOW, 'LIMIT', 0, 100)
if #due > 0 then
  redis.call('RPUSH', QUEUE, unpack(due))
  redis.call('ZREM', scheduled, unpack(due))
end

-- Versions: this replica's per reasoner {version, {versions it reads}, migrates (1|0),
-- on_version_change} (decoded once, when first needed); nil for one it does not serve.
local mine = nil
local function mine_for(name)
  if mine == nil then mine = ARGV[6] == '' and {} or cjson.decode(ARGV[6]) end  -- '': none
  return mine[name]
end

-- The adverts of the live replicas other than this one (a draining one withdraws its
-- own: tick.lua), read and decoded once per call, when first needed.
local adverts = nil
local function live_adverts()
  if adverts ~= nil then return adverts end
  adverts = {}
  local all = redis.call('HGETALL', VERSIONS)
  for i = 1, #all, 2 do
    local until_ms = redis.call('ZSCORE', KEYS[7], all[i])
    if all[i] ~= me and until_ms and tonumber(until_ms) > NOW then
      local ok, advert = pcall(cjson.decode, all[i + 1])
      if ok and type(advert) == 'table' then adverts[#adverts + 1] = advert end
    end
  end
  return adverts
end

-- Whether a live replica other than this one advertises `version` for reasoner `name`.
local function served(name, version)
  for _, advert in ipairs(live_adverts()) do
    if advert[name] and advert[name][1] == version then return true end
  end
  return false
end

-- Whether a live replica other than this one serves reasoner `name` (any version).
local function served_anywhere(name)
  for _, advert in ipairs(live_adverts()) do
    if advert[name] then return true end
  end
  return false
end

-- How this replica meets a checkpoint `from` wrote (versions.py `Rule`).
local function rule_for(name, from)
  local m = mine_for(name)
  if not m or from == m[1] then return RULE_SAME end  -- not served here: the taker refuses it
  for _, version in ipairs(m[2]) do
    if version == from then return RULE_COMPATIBLE end
  end
  if m[3] == 1 then return RULE_MIGRATE end
  if served(name, from) then return RULE_WAIT end
  return m[4]
end

local waits = 0

-- Mark it running here and return it; nil (and cancelled) when its session is released,
-- or (left queued) when its checkpoint waits for a replica of its version.
local function take(id, v)
  local rec, ev = P .. 'x:' .. id, P .. 'ev:' .. id
  local session = scoped(redis.call('HGET', rec, 'tenant') or '', v[3] or '')
  if v[3] ~= '' and redis.call('EXISTS', P .. 'releasing:' .. session) == 1 then
    cancel_queued(rec, ev, id, v[3], 'session_released', v[1])  -- its session is released
    return nil
  end
  local extra = redis.call('HMGET', rec, 'body', 'checkpoint', 'max_attempts', 'scheduled_at',
    'reasoner')
  local name = extra[5]
  if not mine_for(name) and served_anywhere(name) then
    -- Code this replica does not have (a reasoner a newer release dropped): it waits for a
    -- live replica that serves it, never failed unrun here while one lives.
    local queue = 'rq:' .. name
    redis.call('RPUSH', P .. queue, id)
    redis.call('SADD', VQS, queue)
    redis.call('PUBLISH', P .. 'queued', id)  -- its replicas look now
    waits = waits + 1
    return nil
  end
  local rule, from = '', ''
  if extra[2] and extra[2] ~= '' then  -- a checkpoint: can this code read it?
    from = redis.call('HGET', rec, 'checkpoint_version') or ''
    rule = rule_for(name, from)
    if rule == RULE_WAIT then
      local queue = 'vq:' .. name .. SEP .. from
      redis.call('RPUSH', P .. queue, id)
      redis.call('SADD', VQS, queue)
      redis.call('PUBLISH', P .. 'queued', id)  -- its replicas look now
      waits = waits + 1
      return nil
    elseif rule == RULE_RESTART then  -- from the start: nothing of the earlier run is read
      redis.call('HSET', rec, 'checkpoint_aside', extra[2], 'checkpoint', '',
        'checkpoint_version', '', 'checkpoint_asks', 0)
      redis.call('HINCRBY', rec, 'attempt', 1)
      drop_requests(rec)
      extra[2] = false
    end
  end
  local last = redis.call('XREVRANGE', ev, '+', '-', 'COUNT', 1)
  extra[5] = extra[4] or ''  -- read before the move clears it
  extra[4] = last[1] and last[1][1] or '0-0'
  extra[6] = redis.call('HGET', rec, 'checkpoint_asks') or '0'
  extra[7] = redis.call('HGET', rec, 'trace') or ''
  extra[8], extra[9] = rule, from
  local m = mine_for(name)
  move(rec, MOVE_CLAIM, v[1], STATUS_RUNNING, 'replica', me, 'claim', token, 'version',
    m and m[1] or '')
  redis.call('HSET', rec, 'unbegun', '1')  -- until its taker says it begins (begin.lua)
  redis.call('ZADD', RUNNING, v[2], id)
  redis.call('SADD', KEYS[8], id)
  local row = redis.call('HMGET', rec, unpack(F))
  row[I_MOVED] = MOVED_NOT
  return {row, extra, waits}
end

-- The first key whose slot id does not hold yet: its session's turn (skey), then its
-- limit's (ckey); '' when it may run.
local function gate_of(id, skey, ckey)
  for _, key in ipairs({skey or '', ckey or ''}) do
    if key ~= '' and redis.call('SISMEMBER', P .. 'cslots:' .. key, id) == 0 then return key end
  end
  return ''
end

-- Version queues first: this replica's own (their work waited for it), and those of
-- versions no live replica advertises any more (back to the queue's head, for the
-- claimers' `on_version_change`).
for _, queue in ipairs(redis.call('SMEMBERS', VQS)) do
  local name, version = string.match(queue, '^vq:([^' .. SEP .. ']*)' .. SEP .. '(.*)$')
  local anyone = string.match(queue, '^rq:(.*)$')  -- for any replica serving that reasoner
  local m = name and mine_for(name)
  if (m and m[1] == version) or (anyone and mine_for(anyone)) then
    while true do
      local id = redis.call('LPOP', P .. queue)
      if not id then
        redis.call('SREM', VQS, queue)
        break
      end
      local v = redis.call('HMGET', P .. 'x:' .. id, 'status', 'created_at', 'session_id')
      if v[1] == STATUS_QUEUED then
        local claimed = take(id, v)
        if claimed then return claimed end
      end
    end
  elseif not ((name and served(name, version)) or (anyone and served_anywhere(anyone))) then
    local ids = redis.call('LRANGE', P .. queue, 0, -1)
    for i = #ids, 1, -1 do redis.call('LPUSH', QUEUE, ids[i]) end
    redis.call('DEL', P .. queue)
    redis.call('SREM', VQS, queue)
  end
end

while true do
  local id = redis.call('LPOP', QUEUE)
  if not id then break end
  local v = redis.call('HMGET', P .. 'x:' .. id, 'status', 'created_at', 'session_id', 'ckey',
    'skey')
  if v[1] == STATUS_QUEUED then
    local gate = gate_of(id, v[5], v[4])
    if gate == '' then
      local claimed = take(id, v)
      if claimed then return claimed end
    elseif gate == v[5] then
      ready(gate)  -- it waits in its session's queue since its start: now it is due
    else
      wait_in(gate, id)
    end
  end
end

-- The keys whose waiting work may go on, least recently served first: each gives its oldest
-- a slot while fewer than its limit are held (a holder whose execution ended, or is gone,
-- is dropped as it is seen); a key with no free slot leaves `cready` until a holder ends
-- (records.lua release), so no number of blocked keys hides one that may go on.
local READY = P .. 'cready'
for _ = 1, 1000 do
  local key = redis.call('ZRANGE', READY, 0, 0)[1]
  if not key then break end
  local queue, slots = P .. 'cq:' .. key, P .. 'cslots:' .. key
  for _, holder in ipairs(redis.call('SMEMBERS', slots)) do
    if not ACTIVE[redis.call('HGET', P .. 'x:' .. holder, 'status') or ''] then
      redis.call('SREM', slots, holder)
    end
  end
  local turn = string.sub(key, 1, #SESSION_GATE) == SESSION_GATE
  while true do
    local id = redis.call('LINDEX', queue, 0)
    if not id then
      redis.call('ZREM', ckeys, key)
      redis.call('ZREM', READY, key)
      break
    end
    local v = redis.call('HMGET', P .. 'x:' .. id, 'status', 'created_at', 'session_id',
      'climit', 'ckey', 'skey')
    if v[1] ~= STATUS_QUEUED then
      redis.call('LPOP', queue)  -- ended meanwhile
      redis.call('DECR', P .. 'cqueued')
    elseif redis.call('SCARD', slots) >= (turn and 1 or tonumber(v[4]) or 1)
      or (turn and redis.call('ZSCORE', scheduled, id)) then
      redis.call('ZREM', READY, key)  -- no free slot, or the session's next waits for its time
      break
    else
      redis.call('LPOP', queue)
      redis.call('DECR', P .. 'cqueued')
      redis.call('SADD', slots, id)
      redis.call('ZADD', ckeys, NOW_US, key)
      redis.call('ZADD', READY, NOW_US, key)
      local gate = gate_of(id, v[6], v[5])
      if gate ~= '' then
        wait_in(gate, id)  -- its session's turn came: now a slot of its limit
      else
        local claimed = take(id, v)
        if claimed then return claimed end
      end
    end
  end
end
local blocked = redis.call('EXISTS', ckeys)  -- keyed work waits: look again when one ends
if redis.call('EXISTS', READY) == 1 then return {0, blocked, waits} end  -- more to look at now
local soonest = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
if soonest[2] then return {math.max(0, tonumber(soonest[2]) - NOW), blocked, waits} end
return {UNCLAIMED_NONE_SCHEDULED, blocked, waits}
