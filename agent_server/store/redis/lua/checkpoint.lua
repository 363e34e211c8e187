--[[ checkpoint
  KEYS[1]: the record (`x:{id}`). ARGV[1..3]: the common arguments (header.lua).
  A resumable execution's progress, fenced like an end. ARGV[4..]: owner, attempt,
  checkpoint (JSON), the requests asked by then (`checkpoint_asks`: a later attempt's asks
  are numbered from it, so the asks it replays are those made after the checkpoint), the
  version of the code that wrote it ('' unversioned: claim.lua compares it with the
  claimer's). Returns {1|0, the status found ('' if unknown)}.
]]
--! include header.lua
local rec = KEYS[1]
local v = redis.call('HMGET', rec, 'status', 'replica', 'attempt')
if not v[1] then return {0, ''} end
if not OWNED[v[1]] or v[2] ~= ARGV[4] or v[3] ~= ARGV[5] then return {0, v[1]} end
redis.call('HSET', rec, 'checkpoint', ARGV[6], 'checkpoint_asks', ARGV[7],
  'checkpoint_version', ARGV[8])
return {1, v[1]}
