--[[ moves: every write of a record's `status`, checked against the state machine
  (agent_server/model/status.py's table, generated into codes.lua as MOVES, CREATES and
  END_OF).
  KEYS, ARGV: none of its own (the callers pass the record's key).
  Defines: move(rec, transition, found, target, ...) (which keeps the record's history:
  kept_move), to_queued(rec, id, transition, found,
  queue, head, channel, ...), created(transition, status), parked(status, owner),
  unowned(status, owner), held(status, owner), taken(rec, owner, attempt, token).
  A move the table lacks (a bug, as IllegalTransition is in Python) is an error reply,
  raised before the move writes anything.
]]
--! include header.lua

-- `transition` from `found` (the status the caller read) to `target`: the status, the fields
-- the move clears and the caller's own field/value pairs (...), in one HSET (codes.lua's
-- MOVES, the table's rows as code; it writes nothing for a move the table lacks).
-- A move that neither creates nor ends the record (codes.lua KEEPS_MOVE[target]) joins its
-- history, the `moves` field (status.py KEPT_MOVES, `kept_move`): `[at, from, to, attempt,
-- replica, version, how]`, `parked` for a record nobody owns that waits for input, the attempt
-- and replica it begins (to running) or leaves (`was`, read before the move), and the code
-- that ran the attempt it leaves. The last KEPT_MOVES are kept (up to twice as many stored).
local function kept_move(rec, transition, found, target, was)
  local attempt, replica, version = was[1], was[2] or '', was[3] or ''
  local now = redis.call('HMGET', rec, 'attempt', 'replica', 'moves', 'moves_n')
  local to = target
  if target == STATUS_RUNNING then
    attempt, replica, version = now[1], now[2] or '', ''
  elseif target == PARKED_STATUS and (now[2] or '') == '' then
    to = 'parked'
  end
  local from = (found == PARKED_STATUS and (was[2] or '') == '') and 'parked' or found
  -- Its name as status.py `how_of` gives it: a move back to running from waiting for
  -- input is a resume, an ask that parks a park.
  local how = transition
  if target == STATUS_RUNNING and found ~= STATUS_QUEUED then how = 'resume' end
  if to == 'parked' then how = 'park' end
  local entry = cjson.encode({NOW_US / 1000000, from, to, tonumber(attempt), replica,
    version ~= '' and version or cjson.null, how})
  -- Appended as text, never decoded: a move costs the same however many are kept. Once
  -- it holds twice KEPT_MOVES, the oldest go in one decode (a reader shows the last
  -- KEPT_MOVES: reads.py `moves_of`).
  local count = (tonumber(now[4]) or 0) + 1
  local kept = now[3] and (string.sub(now[3], 1, -2) .. ',' .. entry .. ']') or ('[' .. entry .. ']')
  if count >= 2 * KEPT_MOVES then
    local all, last = cjson.decode(kept), {}
    for i = #all - KEPT_MOVES + 1, #all do last[#last + 1] = all[i] end
    kept, count = cjson.encode(last), KEPT_MOVES
  end
  redis.call('HSET', rec, 'moves', kept, 'moves_n', count)
end

local function move(rec, transition, found, target, ...)
  local was = KEEPS_MOVE[target] and redis.call('HMGET', rec, 'attempt', 'replica', 'version')
  if not MOVES(rec, transition, found, target, ...) then
    error({err = 'not a move: ' .. tostring(transition) .. ' from ' .. tostring(found) ..
      ' to ' .. tostring(target)})
  end
  if was then kept_move(rec, transition, found, target, was) end
end

-- The one move to queued (hand-off, retry, requeue, an answer or an expiry of a parked
-- record): the move, clearing what a queued record holds of nobody (status.py
-- QUEUED_CLEARS), with the caller's fields (...); then the id joins `queue` at its tail (at
-- its head with `head`; not at all when `queue` is nil: the caller scheduled it for later)
-- and is announced on `channel`, where takers look.
local function to_queued(rec, id, transition, found, queue, head, channel, ...)
  move(rec, transition, found, STATUS_QUEUED, ...)
  if queue then redis.call(head and 'LPUSH' or 'RPUSH', queue, id) end
  redis.call('PUBLISH', channel, id)
end

-- A new record (create.lua, enqueue.lua write every field at once): `status` must be what
-- `transition`, a creation (no source), makes.
local function created(transition, status)
  if not CREATES(transition, status) then
    error({err = 'not a creation: ' .. tostring(transition) .. ' to ' .. tostring(status)})
  end
end

-- Parked (status.py PARKED): waiting for input, and nobody owns it (its task ended).
local function parked(status, owner)
  return status == PARKED_STATUS and (owner or '') == ''
end

-- Queued or parked: no task runs it, so it ends where it waits.
local function unowned(status, owner)
  return status == STATUS_QUEUED or parked(status, owner)
end

-- An owner's task runs it (running, or waiting for input in its task): not parked.
local function held(status, owner)
  return OWNED[status or ''] == true and (owner or '') ~= ''
end

-- The take's fence (begin.lua, unclaim.lua): what the record holds (status, owner,
-- attempt, claim token) and whether it is running under that owner and attempt, taken by
-- that claim.
local function taken(rec, owner, attempt, token)
  local v = redis.call('HMGET', rec, 'status', 'replica', 'attempt', 'claim')
  return v, v[1] == STATUS_RUNNING and v[2] == owner and v[3] == attempt and
    (v[4] or '') == token
end
