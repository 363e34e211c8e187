--[[ admit: what refuses a new record before anything of it is written (create.lua and
  enqueue.lua).
  KEYS: none of its own (the caller passes `releasing:{sid}` and `idem:{idempotency key}`).
  Defines: refusal(sid, releasing, key, idem, fingerprint): nil when the start may go on,
  else the caller's reply (codes.py `Create`): {RELEASING} the session is being released;
  {KEY_MISMATCH} the key was used for another request; {EXISTING, record} the execution the
  key was first used for; {KEY_FORGOTTEN} that execution was forgotten. The caller sets the
  key once nothing else refuses the start.
]]
--! include judge.lua
local function refusal(sid, releasing, key, idem, fingerprint)
  if sid ~= '' and redis.call('EXISTS', releasing) == 1 then return {CREATE_RELEASING} end
  if key == '' then return nil end
  local first = redis.call('GET', idem)
  if not first then return nil end
  local bar = string.find(first, '|', 1, true)
  if string.sub(first, 1, bar - 1) ~= fingerprint then return {CREATE_KEY_MISMATCH} end
  local earlier = read(string.sub(first, bar + 1))
  if earlier then return {CREATE_EXISTING, earlier} end
  return {CREATE_KEY_FORGOTTEN}
end
