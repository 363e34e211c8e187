--[[ end
  KEYS[1..6]: records.lua's; then per end, in ARGV's order, its record (`x:{id}`), events
  (`ev:{id}`) and `owned:{owner}`. ARGV[1..3]: the common arguments (header.lua).
  Fenced ends, a batch in one call. ARGV[4]: the largest record an end notice carries;
  ARGV[5..]: per end, id, owner, attempt, then the fields it writes (record.lua's
  END_WRITES: status, status_reason, result, error, finished_at, duration_seconds,
  abandoned); it clears END_CLEARS. Returns per end 1|0 and the status found ('' if unknown); an
  end already written by this very owner and attempt (a retry after a lost reply) is 1.
  Prunes once for the batch, and publishes one notice for the ends it wrote: '@', the
  writer's id, a space, then a JSON list of their records (FIELDS order), or of their ids
  for records over the size (the writer skips its own notices: it knows what it wrote).
]]
--! include records.lua
--! include record.lua
NOTIFY = false
PRUNE = false
local largest = tonumber(ARGV[4])
local out, notice = {}, {}
local k = 7
-- Per end: id, owner, attempt, then END_WRITES' values (record.lua).
for i = 5, #ARGV, 3 + #END_WRITES do
  local id, owner, attempt = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local rec, ev, owned = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  k = k + 3
  local written, args = {}, {}
  for j, f in ipairs(END_WRITES) do
    written[f] = ARGV[i + 2 + j]
    if f ~= 'status' then  -- the move writes it
      args[#args + 1] = f
      args[#args + 1] = ARGV[i + 2 + j]
    end
  end
  for j = 1, #END_CLEARS, 2 do
    written[END_CLEARS[j]] = END_CLEARS[j + 1]
    args[#args + 1] = END_CLEARS[j]
    args[#args + 1] = END_CLEARS[j + 1]
  end
  local v = redis.call('HMGET', rec, unpack(F))
  local status, fin = v[I_STATUS], v[I_FINISHED_AT]
  local ok = 0
  if status and v[I_REPLICA] == owner and v[I_ATTEMPT] == attempt then
    if OWNED[status] then
      move(rec, END_OF[written.status], status, written.status, unpack(args))
      finish(rec, ev, id, v[I_SESSION_ID], owned)
      ok = 1
      if #written.result + #written.error <= largest then
        local row = {}
        for j, f in ipairs(F) do row[j] = written[f] or v[j] end
        notice[#notice + 1] = row
      else
        notice[#notice + 1] = id
      end
    elseif status == written.status and fin == written.finished_at then
      ok = 1
    end
  end
  out[#out + 1] = ok
  out[#out + 1] = status or ''
end
prune()
if #notice > 0 then redis.call('PUBLISH', P .. 'ends', '@' .. ME .. ' ' .. cjson.encode(notice)) end
return out
