--[[ header: what every script opens with (included first, once).
  KEYS: each script's own, as its header says (keys.py builds them); this file reads none.
  Every key carries the hash tag `{agent-server:<agent>}` (docs/replicas.md#key-layout).
  ARGV[1..3]: result_ttl (ms); "{max_retained}:{max_retained_bytes}"; the calling
  replica's id. A script's own arguments start at ARGV[4].
  Defines: TTL, MAXR, MAXB, ME, NOW (ms) and NOW_US (us) on Redis's clock, and F, the
  record's hash fields in the order every script returns them, and I_STATUS and the like,
  where each value is in a returned record (both from FIELDS and Row in scripts.py, through
  codes.lua).
  Every script runs as a Redis function (scripts.py `library`): what a file defines is made
  once, when its library is loaded, and the lines between `--! each call` and `--! end each
  call` run at the start of each call, before the script's own code.
]]
--! include codes.lua
local TTL, MAXR, MAXB, ME, NOW, NOW_US
-- The common arguments as last parsed: the same text gives the same values, and a library's
-- locals outlive its calls (as an EVAL, each call parses them).
local PARSED_TTL, PARSED_MAX
--! each call
if ARGV[1] ~= PARSED_TTL then PARSED_TTL, TTL = ARGV[1], tonumber(ARGV[1]) end
-- "{max_retained}:{max_retained_bytes}"
if ARGV[2] ~= PARSED_MAX then
  PARSED_MAX, MAXR, MAXB = ARGV[2], string.match(ARGV[2], '^(%d+):(%d+)$')
  MAXR, MAXB = tonumber(MAXR), tonumber(MAXB)
end
ME = ARGV[3]
local t = redis.call('TIME')
local seconds, micros = tonumber(t[1]), tonumber(t[2])
NOW = seconds * 1000 + math.floor(micros / 1000)
NOW_US = seconds * 1000000 + micros
--! end each call

