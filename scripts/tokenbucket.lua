-- Token bucket in Redisson's RRateLimiter layout (3.21+), so Java services on
-- Redisson and Go services on redlimit can share one limiter.
-- State keys: value, a string caching rate − Σ(permits in the log) (negative
-- after a rate decrease, until grants age out); permits, the log: a zset with
-- score = grant time in ms and member = 0x10, the 16-byte request id, the
-- count as uint32 LE. A record at score s is out of the window once
-- s <= now − interval. The record also tells a re-sent request: its member
-- is in the log already; grants, the log of a config's further rates (see
-- more_load). Sections: see common.lua; the state is a table s
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

-- reset_after is the time until the newest record ages out and the bucket
-- is full: 0 when it has (a request no wait can satisfy reads the log
-- before anything prunes it).
local function reset_after(s)
  local newest = redis.call('ZRANGE', s.log, -1, -1, 'WITHSCORES')
  if #newest == 0 then
    return 0
  end
  return math.max(0, (tonumber(newest[2]) + interval) * 1000 - NOW_US)
end

-- store drops the aged records and caches the value, with both keys expiring
-- when the log empties, reset µs from now.
local function store(s, reset)
  if s.aged > 0 then
    redis.call('ZREMRANGEBYSCORE', s.log, '-inf', string.format('%d', s.cutoff))
    s.aged = 0
  end
  if reset <= 0 then
    redis.call('DEL', s.value_key, s.log)
    return
  end
  local ttl = string.format('%d', expiry(reset, s.value_key))
  redis.call('SET', s.value_key, string.format('%d', s.value), 'PX', ttl)
  redis.call('PEXPIRE', s.log, ttl)
end

-- running reads a record of the grants log (see more_load): the running
-- total of permits after it, and its own permits.
local function running(grants, member)
  local total, permits = string.match(member, '^(%d+):(%d+)$')
  if not total then
    fail('corrupt ' .. grants .. ': member ' .. string.format('%q', member))
  end
  return tonumber(total), tonumber(permits) -- not + 0: gopher-lua (miniredis) reads 010 as octal
end

-- newest_grant is the grants log's newest record (member, score), read by
-- the first further rate and shared by the others.
local newest_grant

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
local s = { value_key = KEYS[2 + kind * (REQUESTS - 1)], log = KEYS[3 + kind * (REQUESTS - 1)], cutoff = NOW_MS - interval }
s.aged = sum(s.log, call(s.log, 'ZRANGEBYSCORE', s.log, '-inf', string.format('%d', s.cutoff)))
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
counted = redis.call('ZADD', s.log, 'NX', string.format('%d', NOW_MS), record(permits)) == 1
if counted then
  s.value, s.changed = s.value - permits, true
  s.reset = interval * 1000 - NOW_US % 1000
end
if s.changed or s.aged > 0 then
  store(s, s.reset or reset_after(s))
end
--[[@write]]
-- Nothing: each step writes Redisson's keys itself.
--[[@encode]]
-- Never flat: Redisson's layout is a hash.
--[[@decode]]
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
--[[@more_load]]
-- A further rate cannot share Redisson's log: a Java client prunes it to the
-- first rate's interval. It reads the grants log instead, a zset of every
-- grant while the config has several rates: score the grant's time in ms,
-- member the running total of permits after it and its own permits,
-- '%016d:%d' (zero-padded, so that members of one ms sort by the total). A
-- rate's usage is the newest total less the total before its oldest grant
-- in the window: two lookups, however many grants the window holds.
-- The rate's steps after the decision load it again: the usage found
-- before is kept in s1.
local grants, cutoff = KEYS[4 + kind * (REQUESTS - 1)], NOW_MS - interval
local total, last, used = 0, 0, 0
newest_grant = newest_grant or call(grants, 'ZRANGE', grants, -1, -1, 'WITHSCORES')
local newest = newest_grant
if #newest > 0 then
  total, last = running(grants, newest[1]), tonumber(newest[2])
  if s1 then
    used = s1
  else
    local oldest = redis.call('ZRANGEBYSCORE', grants, '(' .. cutoff, '+inf', 'LIMIT', 0, 1)
    if #oldest > 0 then
      local after, n = running(grants, oldest[1])
      used = total - (after - n)
    end
  end
end
s1 = used
--[[@more_wait]]
-- Enough of the oldest grants in the window must leave it: records of one
-- permit or more, so need records at most.
local need = used + permits - rate
if need > 0 then
  wait = interval * 1000 -- not reached: permits <= rate, so the window holds enough to free
  local base = total - used
  local records = redis.call('ZRANGEBYSCORE', grants, '(' .. cutoff, '+inf', 'WITHSCORES', 'LIMIT', 0, need)
  for i = 1, #records, 2 do
    if running(grants, records[i]) - base >= need then
      wait = (tonumber(records[i + 1]) + interval) * 1000 - NOW_US
      break
    end
  end
end
--[[@more_commit]]
-- One record serves every further rate: the first of them writes it. Its
-- time never goes back, so that the totals grow with the scores. Records
-- older than every interval go every 64 permits, not on every grant: a
-- command saved per grant, at most 64 stale records kept.
used = used + permits
if last < NOW_MS then last = NOW_MS end
if K == '2' then
  redis.call('ZADD', grants, string.format('%d', last), string.format('%016d:%d', total + permits, permits))
  if (total - total % 64) ~= (total + permits) - (total + permits) % 64 then
    redis.call('ZREMRANGEBYSCORE', grants, '-inf', NOW_MS - longest)
  end
  redis.call('PEXPIRE', grants, string.format('%d', expiry((last + longest) * 1000 - NOW_US, grants)))
end
--[[@more_report]]
remaining = rate - used
if used > 0 then
  reset = (last + interval) * 1000 - NOW_US
end
--[[@more_release]]
-- Permits come off the newest grants, as the first rate's do; the newest
-- left then says when each rate is full again.
back = math.min(permits, used)
used = used - back
if K == '2' then
  local left = permits
  while left > 0 do
    local record = redis.call('ZRANGE', grants, -1, -1, 'WITHSCORES')
    if #record == 0 then
      break
    end
    local after, n = running(grants, record[1])
    redis.call('ZREM', grants, record[1])
    if n > left then
      redis.call('ZADD', grants, record[2], string.format('%016d:%d', after - left, n - left))
      n = left
    end
    left = left - n
  end
end
newest = redis.call('ZRANGE', grants, -1, -1, 'WITHSCORES')
if #newest > 0 then
  last = tonumber(newest[2])
end
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
