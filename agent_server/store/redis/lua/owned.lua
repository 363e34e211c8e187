--[[ owned
  KEYS[1..8]: judge.lua's; KEYS[9]: `owned:{this replica}`. The keys of the ids found there
  are named from the prefix. ARGV[1..3]: the common arguments (header.lua).
  The running executions this replica owns in the store, so it can find those it runs no
  task for (section 12, invariant 3). ARGV[4]: at most this many. Returns {record (read()),
  max_attempts or '', the token of the take (create or claim) that took it ('' for
  none), '1' when a claim's body never began (its `unbegun` mark, as judge.lua reads it)
  else ''} per execution.
]]
--! include judge.lua
local out = {}
local owned = KEYS[9]
for _, id in ipairs(redis.call('SRANDMEMBER', owned, tonumber(ARGV[4]))) do
  local v = read(id)
  if v and OWNED[v[I_STATUS]] and v[I_REPLICA] == ME then
    local r = redis.call('HMGET', P .. 'x:' .. id, 'max_attempts', 'claim', 'unbegun')
    out[#out + 1] = {v, r[1] or '', r[2] or '', r[3] or ''}
  elseif (not v) or v[I_REPLICA] ~= ME then
    redis.call('SREM', owned, id)
  end
end
return out
