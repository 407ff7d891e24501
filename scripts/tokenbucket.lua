-- Token bucket in Redisson's RRateLimiter layout (3.21+), so Java services on
-- Redisson and Go services on redlimit can share one limiter.
-- State keys: value, a string caching rate − Σ(permits in the log) (negative
-- after a rate decrease, until grants age out); permits, the log: a zset with
-- score = grant time in ms and member = 0x10, the 16-byte request id, the
-- count as uint32 LE. A record at score s is out of the window once
-- s <= now − interval. The record also tells a re-sent request: its member
-- is in the log already; grants, the log of a config's further rates (see
-- more_load). Sections: see common.lua; the state is in load's locals, and
-- report writes it, once.

--[[@helpers]]
-- Each function created costs a call about as much as a small Redis
-- command, and each of the script's locals it uses as much again: these use
-- none, only what they are given, and a grant calls three.

-- sum adds up the permits of records first, first + step, … of log until
-- they reach need (none: all of them), and says which record reached it.
local function sum(log, records, step, need)
  local total = 0
  for i = 1, #records, step do
    local member = records[i]
    local n = #member
    if n < 5 then
      error('REDLIMIT corrupt ' .. log .. ': member of ' .. n .. ' bytes', 0)
    end
    local b1, b2, b3, b4 = string.byte(member, n - 3, n)
    total = total + b1 + b2 * 256 + b3 * 65536 + b4 * 16777216
    if need and total >= need then
      return total, i
    end
  end
  return total, nil
end

-- record is the log's member for a grant of permits by this request.
local function record(permits)
  local p = permits
  return '\16' .. ARGV[5] .. string.char(p % 256, (p - p % 256) / 256 % 256, (p - p % 65536) / 65536 % 256,
    (p - p % 16777216) / 16777216 % 256)
end

-- ttl is a state key's TTL for reset µs, in whole ms rounded up. When capped
-- (a stored config that expires: Expire, ExpireAt), no state key outlives
-- the config.
local function ttl(reset, capped)
  local ms = (reset + (-reset) % 1000) / 1000
  if ms < 1 then ms = 1 end
  if capped then
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 and left < ms then ms = left end
  end
  return string.format('%d', ms)
end

-- store caches value, with the value key and the log expiring after ms (a
-- string), when the log empties; with no ms, the log is empty now.
local function store(value_key, log, value, ms)
  if not ms then
    redis.call('DEL', value_key, log)
    return
  end
  redis.call('SET', value_key, string.format('%d', value), 'PX', ms)
  redis.call('PEXPIRE', log, ms)
end

-- running reads a record of the grants log (see more_load): the running
-- total of permits after it, and its own permits.
local function running(grants, member)
  local total, permits = string.match(member, '^(%d+):(%d+)$')
  if not total then
    error('REDLIMIT corrupt ' .. grants .. ': member ' .. string.format('%q', member), 0)
  end
  return tonumber(total), tonumber(permits) -- not + 0: gopher-lua (miniredis) reads 010 as octal
end

-- newest_total and newest_last: the grants log's newest record, its running
-- total and its time in ms (0 and 0 for an empty log), read by the first
-- further rate and shared by the others and by their steps after the
-- decision.
local newest_total, newest_last

--[[@fields]]
--[[@capacity]]
rate
--[[@load]]
-- The permits available: rate − Σ(log in the window). The value key caches
-- rate − Σ(log), as Redisson keeps it: the records that left the window
-- (aged, when there are any) give theirs back here, and go when the state
-- is written. When the cache is missing or impossible the log is summed
-- again, so losing it never resets the limiter. changed: the cache is
-- wrong; dirty: the state is written, once, by report; granted: the time
-- until a grant's record ages out.
local value_key, log = KEYS[2 + kind * (REQUESTS - 1)], KEYS[3 + kind * (REQUESTS - 1)]
local cutoff = string.format('%d', NOW_MS - interval)
local old = redis.pcall('ZRANGEBYSCORE', log, '-inf', cutoff)
if old.err then
  error('REDLIMIT corrupt ' .. log .. ': ' .. old.err, 0)
end
local got = redis.pcall('GET', value_key)
local cached = got and tonumber(got) -- nil for an error, or what is not a number
if got and not (cached and cached % 1 == 0 and cached >= -MAX and cached <= MAX) then
  error('REDLIMIT corrupt ' .. value_key .. ': ' .. (got.err or 'field value = ' .. string.format('%q', got)), 0)
end
local aged, available, changed, dirty, granted = #old > 0, 0, false, false, nil
if aged then
  available = sum(log, old, 1)
end
if not cached or cached + available > rate then
  available, changed = rate - sum(log, redis.call('ZRANGEBYSCORE', log, '(' .. cutoff, '+inf'), 1), true
else
  available = cached + available
end
--[[@wait]]
-- Enough of the oldest records in the window must age out: of one permit or
-- more each, so need records at most. When the whole window frees too few,
-- the cached value was too low (a value key without its log): the log is
-- the truth, and the value is rebuilt from it. A denial still writes a
-- cache it found wrong, as a Redisson client sharing the limiter reads the
-- value key alone.
if permits > available then
  local need = permits - available
  local records = redis.call('ZRANGEBYSCORE', log, '(' .. cutoff, '+inf', 'WITHSCORES', 'LIMIT', 0, need)
  local freed, at = sum(log, records, 2, need)
  if not at and #records / 2 < need and available ~= rate - freed then
    available, changed, need = rate - freed, true, permits - (rate - freed)
    if need > 0 then
      freed, at = sum(log, records, 2, need)
    end
  end
  if at then
    wait = (records[at + 1] + interval) * 1000 - NOW_US
  elseif need > 0 then
    wait = interval * 1000 -- records of several permits each: a full interval frees them all
  end
end
dirty = changed and permits > 0
--[[@commit]]
-- ZADD NX also tells a re-sent request: its record (same id, same member) is
-- in the log already.
counted = redis.call('ZADD', log, 'NX', string.format('%d', NOW_MS), record(permits)) == 1
if counted then
  available, changed, granted = available - permits, true, interval * 1000 - NOW_US % 1000
end
dirty = changed or aged
--[[@write]]
-- Nothing: report writes Redisson's keys, once.
--[[@encode]]
-- Never flat: Redisson's layout is a hash.
--[[@decode]]
--[[@resent]]
redis.call('ZSCORE', log, record(permits)) ~= false
--[[@report]]
-- The bucket is full again when its newest record ages out. The state any
-- step left is written here, with both keys expiring then.
remaining, reset = available, granted
if not granted then
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')[2]
  reset = newest and (newest + interval) * 1000 - NOW_US or 0
  if reset < 0 then reset = 0 end
end
if dirty then
  if aged then
    redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  end
  store(value_key, log, available, reset > 0 and ttl(reset, stored and keepalive == 0))
end
--[[@release]]
-- Permits come off the newest records, so that the log and the value stay
-- in agreement.
if aged then
  redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  aged = false
end
local left = permits
while left > 0 do
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if #newest == 0 then
    break
  end
  local count = sum(log, newest, 2)
  redis.call('ZREM', log, newest[1])
  if count > left then
    redis.call('ZADD', log, newest[2], record(count - left))
    count = left
  end
  left = left - count
end
available, back, dirty = available + permits - left, permits - left, true
--[[@more_load]]
-- A further rate cannot share Redisson's log: a Java client prunes it to the
-- first rate's interval. It reads the grants log instead, a zset of every
-- grant while the config has several rates: score the grant's time in ms,
-- member the running total of permits after it and its own permits,
-- '%016d:%d' (zero-padded, so that members of one ms sort by the total). A
-- rate's usage is the newest total less the total before its oldest grant
-- in the window: two lookups, however many grants the window holds.
-- The rate's steps after the decision load it again: the usage found
-- before is kept in s1. since: the window's start, for ZRANGEBYSCORE.
local grants, since = KEYS[4 + kind * (REQUESTS - 1)], not s1 and string.format('(%d', NOW_MS - interval)
if not newest_total then
  local newest = redis.pcall('ZRANGE', grants, -1, -1, 'WITHSCORES')
  if newest.err then
    error('REDLIMIT corrupt ' .. grants .. ': ' .. newest.err, 0)
  end
  newest_total, newest_last = 0, 0
  if #newest > 0 then
    newest_total, newest_last = running(grants, newest[1]), tonumber(newest[2])
  end
end
local total, last, used = newest_total, newest_last, s1 or 0
if not s1 and total > 0 then
  local oldest = redis.call('ZRANGEBYSCORE', grants, since, '+inf', 'LIMIT', 0, 1)
  if #oldest > 0 then
    local after, n = running(grants, oldest[1])
    used = total - (after - n)
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
  local records = redis.call('ZRANGEBYSCORE', grants, since, '+inf', 'WITHSCORES', 'LIMIT', 0, need)
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
  redis.call('PEXPIRE', grants, ttl((last + longest) * 1000 - NOW_US, stored and keepalive == 0))
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
local newest = redis.call('ZRANGE', grants, -1, -1, 'WITHSCORES')
if #newest > 0 then
  last = tonumber(newest[2])
end
--[[@admin]]
local TYPES, FIELDS = { 'string', 'zset', 'zset' }, {}

-- settle recomputes the cache from the log after a rate change.
local function settle(keys)
  local log = keys[2]
  redis.call('ZREMRANGEBYSCORE', log, '-inf', NOW_MS - interval)
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')[2]
  local reset = newest and (newest + interval) * 1000 - NOW_US or 0
  store(keys[1], log, rate - sum(log, call(log, 'ZRANGE', log, 0, -1), 1), reset > 0 and ttl(reset, stored and keepalive == 0))
end
