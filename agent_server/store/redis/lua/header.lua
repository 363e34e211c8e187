--[[ header: what every script opens with (included first, once).
  KEYS: each script's own, as its header says (keys.py builds them); this file reads none.
  Every key carries the hash tag `{agent-server:<agent>}` (docs/replicas.md#key-layout).
  ARGV[1..3]: result_ttl (ms); "{max_retained}:{max_retained_bytes}"; the calling
  replica's id. A script's own arguments start at ARGV[4].
  Defines: TTL, MAXR, MAXB, ME, NOW (ms) and NOW_US (us) on Redis's clock, and F, the
  record's hash fields in the order every script returns them, and I_STATUS and the like,
  where each value is in a returned record (both from FIELDS and Row in scripts.py, through
  codes.lua).
]]
--! include codes.lua
local TTL = tonumber(ARGV[1])
-- "{max_retained}:{max_retained_bytes}"
local MAXR, MAXB = string.match(ARGV[2], '^(%d+):(%d+)$')
MAXR, MAXB = tonumber(MAXR), tonumber(MAXB)
local ME = ARGV[3]
local t = redis.call('TIME')
local NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local NOW_US = tonumber(t[1]) * 1000000 + tonumber(t[2])

