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
  for i = 1, #members do
    total = total + count_of(log, members[i])
  end
  return total
end

local function record(permits)
  local p2, p3, p4 = (permits - permits % 256) / 256, (permits - permits % 65536) / 65536,
      (permits - permits % 16777216) / 16777216
  return '\16' .. ARGV[5] .. string.char(permits % 256, p2 % 256, p3 % 256, p4 % 256)
end

-- reset_after is the time until the newest record of log ages out and the
-- bucket is full: 0 when it has (a request no wait can satisfy reads the
-- log before anything prunes it).
local function reset_after(log)
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if #newest == 0 then
    return 0
  end
  return math.max(0, (newest[2] + interval) * 1000 - NOW_US)
end

-- store drops the records that left the window (aged: the cutoff, when there are any) and
-- caches value, with both keys expiring when the log empties, reset µs from
-- now.
local function store(value_key, log, aged, value, reset)
  if aged then
    redis.call('ZREMRANGEBYSCORE', log, '-inf', aged)
  end
  if reset <= 0 then
    redis.call('DEL', value_key, log)
    return
  end
  local ttl = string.format('%d', expiry(reset, value_key))
  redis.call('SET', value_key, string.format('%d', value), 'PX', ttl)
  redis.call('PEXPIRE', log, ttl)
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

-- until_free is the time until permits fit, with available permits now:
-- it walks the log from the oldest record in the window until enough free
-- up. When the whole log frees too few, the cached value was too low (a
-- value key without its log): the log is the truth, and the second result
-- is the value rebuilt from it.
local function until_free(log, available, permits)
  local need, freed = permits - available, 0
  local records = redis.call('ZRANGEBYSCORE', log, '(' .. (NOW_MS - interval), '+inf', 'WITHSCORES', 'LIMIT', 0, need)
  for i = 1, #records, 2 do
    freed = freed + count_of(log, records[i])
    if freed >= need then
      return (records[i + 1] + interval) * 1000 - NOW_US
    end
  end
  if #records / 2 < need and available ~= rate - freed then
    if permits <= rate - freed then
      return 0, rate - freed
    end
    local wait, deeper = until_free(log, rate - freed, permits)
    return wait, deeper or rate - freed
  end
  return interval * 1000 -- records of several permits each: a full interval frees them all
end

--[[@fields]]
--[[@capacity]]
rate
--[[@load]]
-- The permits available: rate − Σ(log in the window). The value key caches
-- rate − Σ(log), as Redisson keeps it: the records that left the window
-- (aged, when there are any) give theirs back here, and go on the next
-- write. When the cache is missing or impossible the log is summed again,
-- so losing it never resets the limiter. changed: the cache needs writing;
-- granted: the time until a grant's record ages out.
local value_key, log = KEYS[2 + kind * (REQUESTS - 1)], KEYS[3 + kind * (REQUESTS - 1)]
local cutoff = string.format('%d', NOW_MS - interval)
local old = redis.pcall('ZRANGEBYSCORE', log, '-inf', cutoff)
if old.err then
  fail('corrupt ' .. log .. ': ' .. old.err)
end
local got = redis.pcall('GET', value_key)
local cached = got and tonumber(got) -- nil for an error or what is not a number
if got and not (cached and cached % 1 == 0 and cached >= -MAX and cached <= MAX) then
  integer(value_key, 'value', call(value_key, 'GET', value_key), -MAX, MAX) -- says what is wrong
end
local aged, available, changed, granted = #old > 0, 0, false, nil
for i = 1, #old do
  available = available + count_of(log, old[i])
end
if not cached or cached + available > rate then
  available, changed = rate - sum(log, call(log, 'ZRANGEBYSCORE', log, '(' .. cutoff, '+inf')), true
else
  available = cached + available
end
--[[@wait]]
-- A denial still repairs a cache it found wrong, as a Redisson client
-- sharing the limiter reads the value key alone.
if permits > available then
  local rebuilt
  wait, rebuilt = until_free(log, available, permits)
  if rebuilt then
    available, changed = rebuilt, true
  end
  if wait > 0 and permits > 0 and changed then
    store(value_key, log, aged and cutoff, available, reset_after(log))
    aged = false
  end
end
--[[@commit]]
-- ZADD NX also tells a re-sent request: its record (same id, same member) is
-- in the log already.
counted = redis.call('ZADD', log, 'NX', string.format('%d', NOW_MS), record(permits)) == 1
if counted then
  available, changed, granted = available - permits, true, interval * 1000 - NOW_US % 1000
end
if changed or aged then
  store(value_key, log, aged and cutoff, available, granted or reset_after(log))
end
--[[@write]]
-- Nothing: each step writes Redisson's keys itself.
--[[@encode]]
-- Never flat: Redisson's layout is a hash.
--[[@decode]]
--[[@resent]]
redis.call('ZSCORE', log, record(permits)) ~= false
--[[@report]]
remaining, reset = available, granted or reset_after(log)
--[[@release]]
-- Permits come off the newest records, so that the log and the value stay
-- in agreement.
if aged then
  redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
end
local left = permits
while left > 0 do
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if #newest == 0 then
    break
  end
  local count = count_of(log, newest[1])
  redis.call('ZREM', log, newest[1])
  if count > left then
    redis.call('ZADD', log, newest[2], record(count - left))
    count = left
  end
  left = left - count
end
available = available + permits - left
store(value_key, log, false, available, reset_after(log))
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
  store(keys[1], log, false, rate - sum(log, call(log, 'ZRANGE', log, 0, -1)), reset_after(log))
end
