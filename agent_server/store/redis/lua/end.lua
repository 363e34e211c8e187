--[[ end
  KEYS[1..6]: records.lua's; then per end, in ARGV's order, its record (`x:{id}`), events
  (`ev:{id}`) and `owned:{owner}`. ARGV[1..3]: the common arguments (header.lua).
  Fenced ends, a batch in one call. ARGV[4]: the largest record an end notice carries;
  ARGV[5..]: per end, id, owner, attempt, then the fields it writes (ending.lua's
  END_WRITES: status, status_reason, result, error, finished_at, duration_seconds,
  abandoned); it clears END_CLEARS and reads only END_READS. Returns per end 1|0 and the
  status found ('' if unknown); an end already written by this very owner and attempt (a
  retry after a lost reply) is 1.
  Prunes once for the batch, and publishes one notice for the ends it wrote: '@', the
  writer's id, a space, then a JSON list of their records (FIELDS order), or of their ids
  for records over the size (the writer skips its own notices: it knows what it wrote).
]]
--! include records.lua
--! include ending.lua
NOTIFY = false
PRUNE = false
local largest = tonumber(ARGV[4])
local out, notice = {}, {}
local k = 7
-- Per end: id, owner, attempt, then END_WRITES' values (ending.lua), its status first.
for i = 5, #ARGV, 3 + #END_WRITES do
  local id, owner, attempt, at = ARGV[i], ARGV[i + 1], ARGV[i + 2], i + 3
  local rec, ev, owned = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  k = k + 3
  -- END_READS: status, finished_at, replica, attempt, session_id, then the row's others.
  local v = redis.call('HMGET', rec, unpack(END_READS))
  local status = v[1]
  local ok = 0
  if status and v[3] == owner and v[4] == attempt then
    if OWNED[status] then
      END_MOVE(rec, status, at)
      finish(rec, ev, id, v[5], owned, #ARGV[at + 2] + #ARGV[at + 3], END_FINISH(v))
      ok = 1
      local row = END_ROW(at, v)
      if #row[I_RESULT] + #row[I_ERROR] <= largest then
        notice[#notice + 1] = row
      else
        notice[#notice + 1] = id
      end
    else
      local row = END_ROW(at, v)
      if status == row[I_STATUS] and v[2] == row[I_FINISHED_AT] then ok = 1 end
    end
  end
  out[#out + 1] = ok
  out[#out + 1] = status or ''
end
prune()
if #notice > 0 then redis.call('PUBLISH', P .. 'ends', '@' .. ME .. ' ' .. cjson.encode(notice)) end
return out
