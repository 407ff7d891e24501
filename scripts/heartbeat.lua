-- The heartbeat of degraded mode (WithDegraded): counts this instance live
-- at now, forgets those not heard from for expire ms, keeps the key that
-- long, and returns how many are live and how many of them have this
-- client id.
-- KEYS[1]  the prefix's instances: a zset, member "client-id tag" (HB_TAG_LEN hex digits), score
--          the member's last beat (ms)
-- ARGV     HB_MEMBER, HB_NOW (ms, or '' for Redis TIME), HB_EXPIRE (ms),
--          HB_CLIENT_ID
local now = tonumber(ARGV[HB_NOW])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000 + (t[2] - t[2] % 1000) / 1000
end
local expire = tonumber(ARGV[HB_EXPIRE])
redis.call('ZADD', KEYS[1], string.format('%d', now), ARGV[HB_MEMBER])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now - expire))
redis.call('PEXPIRE', KEYS[1], string.format('%d', expire))
local id = ARGV[HB_CLIENT_ID] .. ' '
local same = 0
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, m in ipairs(live) do
  if #m == #id + HB_TAG_LEN and string.sub(m, 1, #id) == id then
    same = same + 1
  end
end
return { #live, same }
