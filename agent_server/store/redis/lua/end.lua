--[[ end
  KEYS[1..6]: records.lua's; then per end, in ARGV's order, its record (`x:{id}`), events
  (`ev:{id}`) and `owned:{owner}`. ARGV[1..3]: the common arguments (header.lua).
  Fenced ends, a batch in one call. ARGV[4]: the largest record an end notice carries;
  ARGV[5..]: per end, id, owner, attempt, status, status_reason, result, error, finished_at,
  duration_seconds, abandoned. Returns per end 1|0 and the status found ('' if unknown); an
  end already written by this very owner and attempt (a retry after a lost reply) is 1.
  Prunes once for the batch, and publishes one notice for the ends it wrote: '@', the
  writer's id, a space, then a JSON list of their records (FIELDS order), or of their ids
  for records over the size (the writer skips its own notices: it knows what it wrote).
]]
--! include records.lua
NOTIFY = false
PRUNE = false
local largest = tonumber(ARGV[4])
local out, notice = {}, {}
local k = 7
for i = 5, #ARGV, 10 do
  local id, owner, attempt, status, fin = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3],
    ARGV[i + 7]
  local rec, ev, owned = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  k = k + 3
  local v = redis.call('HMGET', rec, 'status', 'replica', 'attempt', 'session_id', 'finished_at',
    'reasoner', 'created_at')
  local ok = 0
  if v[1] and v[2] == owner and v[3] == attempt then
    if OWNED[v[1]] then
      move(rec, END_OF[status], v[1], status, 'status_reason', ARGV[i + 4],
        'result', ARGV[i + 5], 'error', ARGV[i + 6], 'finished_at', fin,
        'duration_seconds', ARGV[i + 8], 'abandoned', ARGV[i + 9])
      finish(rec, ev, id, v[4], owned)
      ok = 1
      if #ARGV[i + 5] + #ARGV[i + 6] <= largest then
        local written = {execution_id = id, reasoner = v[6], session_id = v[4],
          status = status, status_reason = ARGV[i + 4], result = ARGV[i + 5],
          error = ARGV[i + 6], created_at = v[7], finished_at = fin,
          duration_seconds = ARGV[i + 8], replica = owner, attempt = attempt,
          input_request = 'null', scheduled_at = '', abandoned = ARGV[i + 9]}
        local row = {}
        for j, f in ipairs(F) do row[j] = written[f] end
        notice[#notice + 1] = row
      else
        notice[#notice + 1] = id
      end
    elseif v[1] == status and v[5] == fin then
      ok = 1
    end
  end
  out[#out + 1] = ok
  out[#out + 1] = v[1] or ''
end
prune()
if #notice > 0 then redis.call('PUBLISH', P .. 'ends', '@' .. ME .. ' ' .. cjson.encode(notice)) end
return out
