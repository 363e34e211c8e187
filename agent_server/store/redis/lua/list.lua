--[[ list
  KEYS[1..8]: judge.lua's; KEYS[9]: the index (`all`, `running`, `tenant:{tenant}` or
  `session:{scoped sid}`). The keys of the ids found there are named from the prefix.
  ARGV[1..3]: the common arguments (header.lua).
  ARGV[4..]: ids to scan at most, limit, statuses (comma list,
  '' any), reasoner ('' any), byte budget of the results and errors (0: none), '1' to leave
  results out (a session's release reads statuses, not results), and a cursor: the score
  and id of the last record looked at before ('' '' from the newest), the owner
  (identity) the records must have ('' any), and the schedule whose firings started them
  ('' any). Returns the records that match (I_MATCHED
  is 1) or that this call moved to lost (0 when they do not match), newest first, each with
  its own cursor (I_CURSOR), then the cursor past the last id looked at ('' when the index
  holds nothing older). Ids whose record expired are dropped from the index as they are
  met.
]]
--! include judge.lua
local index = KEYS[9]
local scan, limit, reasoner = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[7]
local budget, bare = tonumber(ARGV[8]), ARGV[9] == '1'
local since, since_id, owner = ARGV[10], ARGV[11], ARGV[12] or ''
local schedule = ARGV[13] or ''
local wanted, any = {}, ARGV[6] == ''
for s in string.gmatch(ARGV[6], '[^,]+') do wanted[s] = true end
local ids
if since == '' then
  ids = redis.call('ZREVRANGE', index, 0, scan - 1, 'WITHSCORES')
else
  ids = redis.call('ZREVRANGEBYSCORE', index, since, '-inf', 'WITHSCORES', 'LIMIT', 0, scan)
end
local out = {}
local matched, bytes, last, stopped = 0, 0, '', false
for i = 1, #ids, 2 do
  local id, score = ids[i], ids[i + 1]
  -- Ties on the cursor's score come in descending id order: those not below it were shown.
  if not (score == since and id >= since_id) then
    last = score .. ':' .. id
    local v = read(id)
    if not v then
      redis.call('ZREM', index, id)
    else
      if bare then v[I_RESULT] = 'null' end
      if (any or wanted[v[I_STATUS]]) and (reasoner == '' or v[I_REASONER] == reasoner)
        and (owner == '' or v[I_OWNER] == owner)
        and (schedule == '' or v[I_SCHEDULE_ID] == schedule) then
        matched = matched + 1
        v[I_MATCHED] = 1
        v[I_CURSOR] = last
        out[#out + 1] = v
        bytes = bytes + #v[I_RESULT] + #v[I_ERROR] + 400
      elseif v[I_MOVED] == MOVED_LOST then
        v[I_MATCHED] = 0
        v[I_CURSOR] = last
        out[#out + 1] = v
      end
      -- A page stops at its byte budget (past it by one record at most: the caller then
      -- knows the page is cut), not after Redis has read and sent every big result.
      if matched >= limit or (budget > 0 and bytes > budget) then stopped = true; break end
    end
  end
end
if not stopped and #ids < 2 * scan then last = '' end
out[#out + 1] = last
return out
