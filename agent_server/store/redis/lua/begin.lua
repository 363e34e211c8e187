--[[ begin: the body of a claimed attempt begins (section 12: accepted work is never failed
  unrun). claim.lua marks what it takes `unbegun`; the taker clears the mark here, told
  (held by a Redis replica under Sentinel), before the body begins. A dead owner's take
  still marked never began: judge.lua puts it back on the queue for the same attempt,
  where one that began is judged as begun (its next attempt queued, or `lost`).
  KEYS[1]: the record (`x:{id}`). ARGV[1..3]: the common arguments (header.lua).
  ARGV[4..]: owner, attempt, the claim's token.
  Fenced: only while it is running under that owner and attempt, taken by that claim.
  Returns {1|0, the status found ('' if unknown)}.
]]
--! include moves.lua
local rec = KEYS[1]
local v, fenced_in = taken(rec, ARGV[4], ARGV[5], ARGV[6])
if not v[1] then return {0, ''} end
if not fenced_in then return {0, v[1]} end
redis.call('HSET', rec, 'unbegun', '0')
return {1, v[1]}
