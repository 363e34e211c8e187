--[[ answer
  KEYS[1..5]: the record (`x:{id}`), the prefix (the owner's channel, `cancel:{owner}`, is
  named from it once the owner is read), `queue`, `parked`, the `queued` channel.
  ARGV[1..3]: the common arguments (header.lua).
  Take an answer, exactly once: only while the record is input_required and waits for that
  request. ARGV[4..]: request id, the value (JSON text, checked by the caller), the bytes of
  answers the execution keeps at most (--max-answer-bytes; the caller refuses one larger).
  Keeps the answer as `answer:{request id}` (for the owner's timeout, a re-read after a
  missed notice, and the asks a later attempt replays) and clears input_request. The kept
  answers' bytes are `answer_bytes`; past the bound the oldest (lowest ids: those before
  the last checkpoint first) are dropped until it fits (`answers_from`: no answer is kept
  below it). A dropped one's ask is asked again by a later attempt (ask.lua), never
  answered wrongly; end and forget delete them all (records.lua). Waiting in
  its owner's task: status running, and the answer is published to the owner:
  {"id", "request_id", "value"}. Parked (nobody owns it): status queued, on the queue for
  whichever replica takes it first, which resumes it from its last checkpoint.
  A retry of an answer taken already (its reply lost, or in doubt), the same text as the
  kept answer: taken again, idempotently, nothing written or published (a told write's
  WAIT, behind its PUBLISH, covers the first one too). The kept answer in other text:
  returned for the caller to compare as JSON (and send again in the kept text if the same).
  Returns {1, record (F's order)} taken; {2, record} taken before, the same text; {3, the
  kept answer's text} taken before, another text; {0, the status found ('' if unknown),
  the pending request id ('' if none)} refused.
]]
--! include moves.lua
local rec = KEYS[1]
local v = redis.call('HMGET', rec, 'status', 'asking', 'replica', 'execution_id')
if not v[1] then return {0, '', ''} end
if v[1] ~= STATUS_INPUT_REQUIRED or v[2] ~= ARGV[4] then
  local kept = redis.call('HGET', rec, 'answer:' .. ARGV[4])
  if kept == ARGV[5] then return {2, redis.call('HMGET', rec, unpack(F))} end
  if kept then return {3, kept} end
  return {0, v[1], v[2] or ''}
end
local id, bound = tonumber(ARGV[4]), tonumber(ARGV[6])
local info = redis.call('HMGET', rec, 'answer_bytes', 'answers_from', 'asked_top')
local total = tonumber(info[1] or '0') + #ARGV[5]
local from = math.min(tonumber(info[2] or ARGV[4]), id)
if total > bound then
  local top = tonumber(info[3] or ARGV[4])
  local k = from
  while total > bound and k <= top do
    if k ~= id then
      local size = redis.call('HSTRLEN', rec, 'answer:' .. k)
      if size > 0 then
        redis.call('HDEL', rec, 'answer:' .. k)
        total = total - size
      end
    end
    k = k + 1
  end
  if id >= from and id < k then from = id else from = k end
end
local answered = {'answer:' .. ARGV[4], ARGV[5], 'answer_bytes', tostring(total), 'answers_from',
  tostring(from)}
if parked(v[1], v[3]) then
  redis.call('ZREM', KEYS[4], v[4])
  to_queued(rec, v[4], MOVE_ANSWER, v[1], KEYS[3], false, KEYS[5], unpack(answered))
else
  move(rec, MOVE_ANSWER, v[1], STATUS_RUNNING, unpack(answered))
  redis.call('PUBLISH', KEYS[2] .. 'cancel:' .. v[3],
    '{"id":"' .. v[4] .. '","request_id":' .. ARGV[4] .. ',"value":' .. ARGV[5] .. '}')
end
local row = redis.call('HMGET', rec, unpack(F))
return {1, row}
