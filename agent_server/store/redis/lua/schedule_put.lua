--[[ schedule_put
  KEYS[1]: the schedules' documents (`schedules`, a hash: key -> JSON text).
  KEYS[2]: each document's own version (`schedules:versions`, a hash: key -> token).
  KEYS[3]: the store's version of them all (`schedules:version`, a string).
  KEYS[4]: the keys the schedule's tenant counts (`schedules:tenant:<tenant>`, a set).
  ARGV[1..3]: the common arguments (header.lua).
  ARGV[4]: the schedule's key; ARGV[5]: its document; ARGV[6]: a new token, written as its
  own version and as the store's (a token, never a count: schedule_docs.py says why).
  ARGV[7]: the most schedules the tenant may have, '' for a document no count holds (a
  declared schedule's `enabled`).
  Returns 1 when kept; 0 when refused, a new document whose tenant holds ARGV[7] already:
  then nothing changed. One script, so two replicas making the last one at once make one.
]]
--! include header.lua
local documents, versions, version, counted = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local key, document, token, limit = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
if limit ~= '' then
  if redis.call('SISMEMBER', counted, key) == 0 then
    -- A change of a document kept (one made before the count, too) is never refused.
    if redis.call('HEXISTS', documents, key) == 0
        and redis.call('SCARD', counted) >= tonumber(limit) then
      return 0
    end
    redis.call('SADD', counted, key)
  end
end
redis.call('HSET', documents, key, document)
redis.call('HSET', versions, key, token)
redis.call('SET', version, token)
return 1
