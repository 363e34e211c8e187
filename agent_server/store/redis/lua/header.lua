--[[ header: what every script opens with (included first, once).
  KEYS: none. Every key is named from ARGV[1], the prefix (`agent-server:{agent}:`); the
  layout is in docs/replicas.md#key-layout.
  ARGV[1..4]: the prefix; result_ttl (ms); "{max_retained}:{max_retained_bytes}"; the
  calling replica's id. A script's own arguments start at ARGV[5].
  Defines: P, TTL, MAXR, MAXB, ME, NOW (ms) and NOW_US (us) on Redis's clock, and F, the
  record's hash fields in the order every script returns them, and I_STATUS and the like,
  where each value is in a returned record (both from FIELDS and Row in scripts.py, through
  codes.lua).
]]
--! include codes.lua
local P = ARGV[1]
local TTL = tonumber(ARGV[2])
-- "{max_retained}:{max_retained_bytes}"
local MAXR, MAXB = string.match(ARGV[3], '^(%d+):(%d+)$')
MAXR, MAXB = tonumber(MAXR), tonumber(MAXB)
local ME = ARGV[4]
local t = redis.call('TIME')
local NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local NOW_US = tonumber(t[1]) * 1000000 + tonumber(t[2])

