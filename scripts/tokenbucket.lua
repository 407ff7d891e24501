-- Token bucket in Redisson's RRateLimiter layout (3.21+), so Java services on
-- Redisson and Go services on redlimit can share one limiter.
-- State keys: value, a string caching rate − Σ(permits in the log) (negative
-- after a rate decrease, until grants age out); permits, the log: a zset with
-- score = grant time in ms and member = 0x10, the 16-byte request id, the
-- count as uint32 LE. A record at score s is out of the window once
-- s <= now − interval. The record also tells a re-sent request: its member
-- is in the log already. Sections: see common.lua; the state is a table s
-- (value_key, log, cutoff, aged, value, changed, reset) the helpers share.

--[[@helpers]]
local function count_of(log, member)
  local n = #member
  if n < 5 then
    fail('corrupt ' .. log .. ': member of ' .. n .. ' bytes')
  end
  local b1, b2, b3, b4 = string.byte(member, n - 3, n)
  return b1 + b2 * 256 + b3 * 65536 + b4 * 16777216
end

local function sum(log, members)
  local total = 0
  for _, member in ipairs(members) do
    total = total + count_of(log, member)
  end
  return total
end

local function record(permits)
  return '\16' .. ARGV[6] .. string.char(permits % 256, math.floor(permits / 256) % 256,
    math.floor(permits / 65536) % 256, math.floor(permits / 16777216) % 256)
end

-- reset_after is the time until the newest record ages out and the bucket is full.
local function reset_after(s)
  local newest = redis.call('ZRANGE', s.log, -1, -1, 'WITHSCORES')
  if #newest == 0 then
    return 0
  end
  return (tonumber(newest[2]) + interval) * 1000 - NOW_US
end

-- store drops the aged records and caches the value, with both keys expiring
-- when the log empties, reset µs from now.
local function store(s, reset)
  if s.aged > 0 then
    redis.call('ZREMRANGEBYSCORE', s.log, '-inf', s.cutoff)
    s.aged = 0
  end
  if reset <= 0 then
    redis.call('DEL', s.value_key, s.log)
    return
  end
  local ttl = expiry(reset, s.value_key)
  redis.call('SET', s.value_key, s.value, 'PX', ttl)
  redis.call('PEXPIRE', s.log, ttl)
end

-- until_free walks the log from the oldest record until enough permits free
-- up. When the whole log frees too few, the cached value was too low (a
-- value key without its log): the log is the truth, and the value is rebuilt.
local function until_free(s, permits)
  local need = permits - s.value
  if need <= 0 then
    return 0
  end
  local freed = 0
  local records = redis.call('ZRANGEBYSCORE', s.log, '(' .. s.cutoff, '+inf', 'WITHSCORES', 'LIMIT', 0, need)
  for i = 1, #records, 2 do
    freed = freed + count_of(s.log, records[i])
    if freed >= need then
      return (tonumber(records[i + 1]) + interval) * 1000 - NOW_US
    end
  end
  if #records / 2 < need and s.value ~= rate - freed then
    s.value, s.changed = rate - freed, true
    return until_free(s, permits)
  end
  return interval * 1000 -- records of several permits each: a full interval frees them all
end

--[[@fields]]
--[[@capacity]]
rate
--[[@load]]
-- The permits available: rate − Σ(log in the window). The value key caches
-- it; when the cache is missing or impossible the log is summed again, so
-- losing it never resets the limiter. aged counts the records that left the
-- window, for the next write to drop.
local s = { value_key = KEYS[4 + kind * N], log = KEYS[5 + kind * N], cutoff = NOW_MS - interval }
s.aged = sum(s.log, call(s.log, 'ZRANGEBYSCORE', s.log, '-inf', s.cutoff))
local value = integer(s.value_key, 'value', call(s.value_key, 'GET', s.value_key), -MAX, MAX)
if value == nil or value + s.aged > rate then
  s.value, s.changed = rate - sum(s.log, call(s.log, 'ZRANGEBYSCORE', s.log, '(' .. s.cutoff, '+inf')), true
else
  s.value = value + s.aged
end
--[[@wait]]
-- A denial still repairs a cache it found wrong, as a Redisson client
-- sharing the limiter reads the value key alone.
wait = until_free(s, permits)
if wait > 0 and permits > 0 and s.changed then
  store(s, reset_after(s))
end
--[[@commit]]
-- ZADD NX also tells a re-sent request: its record (same id, same member) is
-- in the log already.
counted = redis.call('ZADD', s.log, 'NX', NOW_MS, record(permits)) == 1
if counted then
  s.value, s.changed = s.value - permits, true
  s.reset = interval * 1000 - NOW_US % 1000
end
if s.changed or s.aged > 0 then
  store(s, s.reset or reset_after(s))
end
--[[@resent]]
redis.call('ZSCORE', s.log, record(permits)) ~= false
--[[@report]]
remaining, reset = s.value, s.reset or reset_after(s)
--[[@release]]
-- Permits come off the newest records, so that the log and the value stay
-- in agreement.
if s.aged > 0 then
  redis.call('ZREMRANGEBYSCORE', s.log, '-inf', s.cutoff)
  s.aged = 0
end
local left = permits
while left > 0 do
  local newest = redis.call('ZRANGE', s.log, -1, -1, 'WITHSCORES')
  if #newest == 0 then
    break
  end
  local count = count_of(s.log, newest[1])
  redis.call('ZREM', s.log, newest[1])
  if count > left then
    redis.call('ZADD', s.log, newest[2], record(count - left))
    count = left
  end
  left = left - count
end
s.value = s.value + permits - left
store(s, reset_after(s))
back = permits - left
--[[@admin]]
local TYPES, FIELDS = { 'string', 'zset', 'zset' }, {}

-- settle recomputes the cache from the log after a rate change.
local function settle(keys)
  local log = keys[2]
  redis.call('ZREMRANGEBYSCORE', log, '-inf', NOW_MS - interval)
  local s = { value_key = keys[1], log = log, aged = 0 }
  s.value = rate - sum(log, call(log, 'ZRANGE', log, 0, -1))
  store(s, reset_after(s))
end
