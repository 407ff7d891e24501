-- A batch: the decisions of many callers in one script call (batch.go).
-- Before this file, script.go puts common.lua's start (the call's clock)
-- and, for each algorithm, makers[name]: a function that makes its decide,
-- common.lua's decision with the algorithm's sections pasted in. Each is
-- made once per call, when its first request comes.
--
-- KEYS     every request's keys, one request's after another's
-- ARGV[1]  'batch'
-- ARGV[2]  now in µs, or '' to read Redis TIME, once for the batch
-- ARGV[3 ..]  per request, in the order the callers came: its algorithm,
--          how many keys it has, how many arguments, then its arguments,
--          as a lone call's ARGV (an ARGV[2] of '' is the batch's clock)
--
-- The reply has one element per request, in order: the decision's reply (a
-- string; a release's integer), 'admin' for a request the decision refused
-- (its client sends it again alone, for admin.lua to say why), or {error}
-- for one whose decision raised an error: that request's alone. A request
-- is decided exactly as it would be alone at the batch's time.
local deciders, replies, k, a = {}, {}, 1, 3
while a <= #ARGV do
  local name, nk, na = ARGV[a], ARGV[a + 1] + 0, ARGV[a + 2] + 0
  local decide = deciders[name]
  if not decide then
    decide = makers[name]()
    deciders[name] = decide
  end
  local ok, reply = pcall(decide, { unpack(KEYS, k, k + nk - 1) }, { unpack(ARGV, a + 3, a + 2 + na) })
  if not ok then
    -- Redis raises its errors as tables, the scripts theirs as strings.
    if type(reply) == 'table' then reply = reply.err end
    reply = { type(reply) == 'string' and reply or 'error' }
  elseif reply == nil then
    reply = 'admin'
  end
  replies[#replies + 1] = reply
  k, a = k + nk, a + 3 + na
end
return replies
