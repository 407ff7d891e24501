-- Token bucket in Redisson's RRateLimiter layout (3.21+), so Java services on
-- Redisson and Go services on redlimit can share one limiter.
-- State keys: value, a string caching rate − Σ(permits in the log) (negative
-- after a rate decrease, until grants age out); permits, the log: a zset with
-- score = grant time in ms and member = 0x10, a 16-byte request id, the
-- count as uint32 LE (so a rate is below 2^32: config.go). A record at score
-- s is out of the window once s <= now − interval. grants, the log of a
-- config's further rates (see more_load). Sections: see common.lua; the
-- state is in load's locals; commit writes a grant's record, write the
-- rest, once.
--
-- The bound: grants that fall in one slice of the interval (interval / 64
-- rounded up, at least 1 ms; slices aligned to the epoch) share one record,
-- whose score moves to its latest grant and whose id is that grant's. Every
-- write drops the records out of the window, so a log holds at most 65
-- records (slices + 1), and every call reads or changes O(65) of them, however
-- many grants the window holds. A record frees its permits with its latest
-- grant: the limiter can only under-admit, by at most one slice's permits for
-- at most one slice. Redisson's Java clients write a record per grant; such
-- a log is read exactly, at a cost in proportion to its records (as Java's
-- own calls pay), and our grants coalesce into its newest record of the slice.
-- A re-sent script (go-redis re-sends after a read timeout) finds its id on
-- the newest record up to its slice, unless another grant came between: it
-- then counts twice, which only denies sooner; WithRetryWindow's request log
-- (common.lua's first_run) makes it exact.
--
-- Cost: each command a call runs costs about a microsecond of Redis's time.
-- The value is read once and the log once (its records out of the window,
-- or all of it when the value is missing: a new limiter's first grant reads
-- an empty log once, and looks up no slice); a denial reads the newest
-- record once, for both resent and report, and a release knows it from the
-- records it read.

--[[@helpers]]
-- Each function created costs a call about as much as a small Redis
-- command, and each of the script's locals it uses as much again: these use
-- none, only what they are given, and a grant calls three.

-- count is the permits of a record of log.
local function count(log, member)
  local n = #member
  if n < 5 then
    error('REDLIMIT corrupt ' .. log .. ': member of ' .. n .. ' bytes', 0)
  end
  local b1, b2, b3, b4 = string.byte(member, n - 3, n)
  return b1 + b2 * 256 + b3 * 65536 + b4 * 16777216
end

-- sum adds up the permits of records first, first + step, … of log until
-- they reach need (none: all of them), and says which record reached it.
local function sum(log, records, step, need)
  local total = 0
  for i = 1, #records, step do
    total = total + count(log, records[i])
    if need and total >= need then
      return total, i
    end
  end
  return total, nil
end

-- record is the log's member for a grant of permits by the request whose
-- head (0x10 and its id) is given.
local function record(permits, head)
  local p = permits
  return head .. string.char(p % 256, (p - p % 256) / 256 % 256,
    (p - p % 65536) / 65536 % 256, (p - p % 16777216) / 16777216 % 256)
end

-- slice finds the record a grant at now (ms) coalesces into: the newest at
-- or before the end of now's slice of interval, its score, and the slice's
-- start; the record is in the slice when its score is at or after the start.
local function slice(log, now, interval)
  local q = (interval + 63 - (interval + 63) % 64) / 64
  local start = now - now % q
  local newest = redis.call('ZREVRANGEBYSCORE', log, string.format('%d', start + q - 1), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  return newest[1], newest[2] and tonumber(newest[2]), start
end

-- sent says whether the grant of request id is the newest record up to
-- now's slice: a re-sent script, whose first run was granted (see the top).
-- newest, the log's newest record and its score when read already, is that
-- record unless it is stamped past the slice (by a clock ahead).
local function sent(log, now, interval, id, newest)
  local member
  local q = (interval + 63 - (interval + 63) % 64) / 64
  if newest and (not newest[2] or newest[2] + 0 < now - now % q + q) then
    member = newest[1]
  else
    member = slice(log, now, interval)
  end
  return member ~= nil and string.sub(member, 2, 17) == id
end

-- time_to_full is the µs from now until the newest record of log ages out
-- and the bucket is full again, 0 for none: newest, the record and its
-- score as ZRANGE … WITHSCORES gives them, when read already.
local function time_to_full(log, interval, now, newest)
  local score = (newest or redis.call('ZRANGE', log, -1, -1, 'WITHSCORES'))[2]
  local left = score and (score + interval) * 1000 - now or 0
  if left < 0 then left = 0 end
  return left
end

-- ttl is a state key's TTL for reset µs, in whole ms rounded up. Given the
-- config's key when it is stored and may expire (Expire, ExpireAt), no state
-- key outlives the config.
local function ttl(reset, config)
  local ms = (reset + (-reset) % 1000) / 1000
  if ms < 1 then ms = 1 end
  if config then
    local left = redis.call('PTTL', config)
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

-- running reads a record of the grants log (see more_load) whose member
-- ends in tag: the running total of permits after it, and its own permits.
local function running(grants, member, tag)
  local total, permits = string.match(member, '^(%d+):(%d+)' .. tag .. '$')
  if not total then
    error('REDLIMIT corrupt ' .. grants .. ': member ' .. string.format('%q', member), 0)
  end
  return tonumber(total), tonumber(permits) -- not + 0: gopher-lua (miniredis) reads 010 as octal
end

-- granted holds what each grant of this call of the script left in its log,
-- by the log's key: { now (ms), interval, the value, its record, the
-- record's score, the keys' TTL (ms) }. A batch's requests share the call
-- (batch.lua), and one on a log that a grant of the same time and interval
-- wrote before it, with no request on the log between, finds the state as
-- that grant left it: no record out of the window, the value cached, its
-- slice's record, and both keys expiring when this grant's would (the
-- same ms, on the same server clock). A grant on a hot key then runs 4
-- commands fewer.
local granted = {}

--[[@fields]]

--[[@capacity]]
rate

--[[@decode]]

--[[@load]]
-- The permits available: rate − Σ(log in the window). The value key caches
-- rate − Σ(log), as Redisson keeps it: the records that left the window
-- (aged: how many) give theirs back here, and go when the state is written.
-- When the cache is missing or impossible the log is summed again, so
-- losing it never resets the limiter; when it is missing the whole log is
-- read at once (a new limiter's first grant reads an empty log once). What
-- a grant of this call left (granted) is not read again.
-- changed: the cache is wrong; empty: the log is empty; newest: the log's
-- newest record and its score, once read; full_after: µs until the bucket is
-- full again, once known; seen: granted's entry for the log, taken (a grant
-- puts one back); mine, mine_at: the grant's record and score, when it is
-- its slice's only one.
local value_key, log = KEYS[2 + kind * (REQUESTS - 1)], KEYS[3 + kind * (REQUESTS - 1)]
local cutoff = string.format('%d', NOW_MS - interval)
local aged, available, changed, empty, newest, full_after = 0, 0, false, false, nil, nil
local seen, mine, mine_at = granted[log], nil, nil
granted[log] = nil
if seen and (seen[1] ~= NOW_MS or seen[2] ~= interval) then
  seen = nil
end
if seen then
  available = seen[3]
  if available > rate then -- a handle of a lower rate
    available, changed = rate - sum(log, redis.call('ZRANGEBYSCORE', log, '(' .. cutoff, '+inf'), 1), true
  end
else
  local got = redis.pcall('GET', value_key)
  local cached = got and tonumber(got) -- nil for an error, or what is not a number
  if got and not (cached and cached % 1 == 0 and cached >= -MAX and cached <= MAX) then
    error('REDLIMIT corrupt ' .. value_key .. ': ' .. (got.err or 'field value = ' .. string.format('%q', got)), 0)
  end
  local records
  if cached then
    records = redis.pcall('ZRANGEBYSCORE', log, '-inf', cutoff)
  else
    records = redis.pcall('ZRANGEBYSCORE', log, '-inf', '+inf', 'WITHSCORES')
  end
  if records.err then
    error('REDLIMIT corrupt ' .. log .. ': ' .. records.err, 0)
  end
  if cached then
    aged, available = #records, cached + sum(log, records, 1)
    if available > rate then
      available, changed = rate - sum(log, redis.call('ZRANGEBYSCORE', log, '(' .. cutoff, '+inf'), 1), true
    end
  else
    local used, out = 0, NOW_MS - interval
    for i = 1, #records, 2 do
      local n = count(log, records[i])
      if records[i + 1] + 0 <= out then aged = aged + 1 else used = used + n end
    end
    available, changed, empty = rate - used, true, #records == 0
  end
end

--[[@wait]]
-- Enough of the oldest records in the window must age out: of one permit or
-- more each, so need records at most. When the whole window frees too few,
-- the cached value was too low (a value key without its log): the log is
-- the truth, and the value is rebuilt from it. A denial reads the newest
-- record, once, for resent and report.
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
  if wait > 0 then
    newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  end
end
-- A decision that is no grant still writes a cache it found wrong, as a
-- Redisson client sharing the limiter reads the value key alone.
if changed and permits > 0 then
  rewrite = true
end

--[[@commit]]
-- The grant joins its slice's record (see the top), which takes its time
-- and id: a record whose id is this request's is its own first run's. Its
-- member is written before the old one goes, with NX: a member there
-- already is this request's too (alone in an older record). A re-sent
-- script, not counted, still writes a state it found wrong or aged.
local member, score, start
if seen then
  local q = (interval + 63 - (interval + 63) % 64) / 64
  member, score, start = seen[4], seen[5], NOW_MS - NOW_MS % q
elseif not empty then
  member, score, start = slice(log, NOW_MS, interval)
end
if member and string.sub(member, 2, 17) == ARGV[ID] then
  counted = false
else
  local n, at, merge = permits, NOW_MS, member and score >= start
  if merge then
    n = n + count(log, member)
    merge = n <= 4294967295 -- the record's count fits its 4 bytes: else a record of its own
    if not merge then
      n = permits
    elseif score > at then
      at = score -- a grant stamped later, by a client whose clock is ahead
    end
  end
  local grant = record(n, '\16' .. ARGV[ID])
  counted = redis.call('ZADD', log, 'NX', string.format('%d', at), grant) == 1
  if counted then
    if merge then
      redis.call('ZREM', log, member)
    end
    available, changed, full_after = available - permits, true, (at + interval) * 1000 - NOW_US
    if merge or not (member and score >= start) then
      mine, mine_at = grant, at
    end
  end
end
rewrite = not counted and (changed or aged > 0)

--[[@resent]]
sent(log, NOW_MS, interval, ARGV[ID], newest)

--[[@release]]
-- A refund gives back nothing: a further rate's log holds running totals,
-- so taking permits off an older record would rewrite every later one.
-- A lease's unused permits so count until they age out.
if grant_at then permits = 0 end
-- Permits come off the newest records, so that the log and the value stay
-- in agreement; a record partly given back keeps its time and id. Records
-- are read 64 at a time: a log of ours holds fewer (see the top). What they
-- show of the newest record left says when the bucket is full again:
-- last, its score; ended, the log's last records were read.
if aged > 0 then
  redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  aged = 0
end
local left, last, ended = permits, nil, false
while left > 0 do
  local records = redis.call('ZREVRANGE', log, 0, 63, 'WITHSCORES')
  ended = #records < 128
  if #records == 0 then
    break
  end
  local gone = {}
  for i = 1, #records, 2 do
    local member = records[i]
    local n = count(log, member)
    gone[#gone + 1] = member
    if n > left then
      redis.call('ZADD', log, records[i + 1], record(n - left, string.sub(member, 1, #member - 4)))
      n, last = left, records[i + 1]
    end
    left = left - n
    if left == 0 then
      last = last or records[i + 3]
      break
    end
  end
  redis.call('ZREM', log, unpack(gone))
end
if last then
  full_after = (last + interval) * 1000 - NOW_US
elseif ended then
  full_after = 0
end
available, back = available + permits - left, permits - left

--[[@encode]]
-- Never flat: Redisson's layout is a hash.

--[[@write]]
-- What a grant, a release or a decision that found the cache wrong left:
-- the records out of the window go, and the value is cached, both keys
-- expiring when the newest record ages out; after a grant of this call at
-- the same time (seen), the log's expiry stands. A grant's is kept in
-- granted.
if aged > 0 then
  redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
end
full_after = full_after or time_to_full(log, interval, NOW_US, newest)
if seen and counted then
  redis.call('SET', value_key, string.format('%d', available), 'PX', seen[6])
else
  local ms = full_after > 0 and ttl(full_after, stored and keepalive == 0 and KEYS[1])
  store(value_key, log, available, ms)
  seen = counted and { NOW_MS, interval, available, nil, nil, ms }
end
if mine then
  seen[3], seen[4], seen[5] = available, mine, mine_at
  granted[log] = seen
end

--[[@more_encode]]
-- Nothing: a further rate's commit and release write its grants log.

--[[@more_write]]

--[[@report]]
-- The bucket is full again when its newest record ages out.
remaining, reset = available, full_after or time_to_full(log, interval, NOW_US, newest)

--[[@more_load]]
-- A further rate cannot share Redisson's log: a Java client prunes it to the
-- first rate's interval. It keeps records of its own in the grants log,
-- each rate in a range of scores of its own: rate k's are its grants' times
-- in ms plus (k − 2) × 2^45 (2^45 ms is 1,115 years; every score stays below
-- 2^53). A member is the running total of the rate's permits after the
-- record and the record's own permits, '%016d:%d', then ':k' for k > 2, so
-- that no two rates' members are equal. Its grants coalesce by slices of its
-- interval, as the first rate's do (see the top): at most 65 records each.
-- A rate's usage is its newest total less the total before its oldest
-- record in the window: two lookups. The steps after the decision load it
-- again from s1 (the usage) and s2 (the newest record's total, time in ms
-- and member). base, top: the rate's range of scores; since: the window's
-- start, for ZRANGEBYSCORE.
local grants, base, tag = KEYS[4 + kind * (REQUESTS - 1)], (K - 2) * 35184372088832, K == '2' and '' or ':' .. K
local top = '(' .. string.format('%d', base + 35184372088832)
local since = '(' .. string.format('%d', base + NOW_MS - interval)
if not s1 then
  local newest = redis.pcall('ZREVRANGEBYSCORE', grants, top, string.format('%d', base), 'WITHSCORES', 'LIMIT', 0, 1)
  if newest.err then
    error('REDLIMIT corrupt ' .. grants .. ': ' .. newest.err, 0)
  end
  s1, s2 = 0, { 0, 0, nil }
  if #newest > 0 then
    s2 = { running(grants, newest[1], tag), tonumber(newest[2]) - base, newest[1] }
    local oldest = redis.call('ZRANGEBYSCORE', grants, since, top, 'LIMIT', 0, 1)
    if #oldest > 0 then
      local after, n = running(grants, oldest[1], tag)
      s1 = s2[1] - (after - n)
    end
  end
end
local used, total, last = s1, s2[1], s2[2]

--[[@more_wait]]
-- Enough of the oldest records in the window must leave it: records of one
-- permit or more, so need records at most.
local need = used + permits - rate
if need > 0 then
  wait = interval * 1000 -- not reached: permits <= rate, so the window holds enough to free
  local base_total = total - used
  local records = redis.call('ZRANGEBYSCORE', grants, since, top, 'WITHSCORES', 'LIMIT', 0, need)
  for i = 1, #records, 2 do
    if running(grants, records[i], tag) - base_total >= need then
      wait = (tonumber(records[i + 1]) - base + interval) * 1000 - NOW_US
      break
    end
  end
end

--[[@more_commit]]
-- The grant joins its slice's record, whose time never goes back, so that
-- the totals grow with the scores. A new record first drops the rate's
-- records out of its window: between two new records nothing is added, so
-- the rate never holds more than 65.
used = used + permits
local q = (interval + 63 - (interval + 63) % 64) / 64
local member, n = s2[3], permits
if member and last >= NOW_MS - NOW_MS % q then
  local _, had = running(grants, member, tag)
  n = n + had
  redis.call('ZREM', grants, member)
else
  redis.call('ZREMRANGEBYSCORE', grants, string.format('%d', base), string.format('%d', base + NOW_MS - interval))
end
if last < NOW_MS then last = NOW_MS end
total = total + permits
redis.call('ZADD', grants, string.format('%d', base + last), string.format('%016d:%d', total, n) .. tag)
if K == '2' then
  redis.call('PEXPIRE', grants, ttl((last + longest) * 1000 - NOW_US, stored and keepalive == 0 and KEYS[1]))
end

--[[@more_release]]
-- Permits come off the rate's newest records in its window, as the first
-- rate's do; the newest left then says when the rate is full again.
back = math.min(permits, used)
used = used - back
local left = back
while left > 0 do
  local records = redis.call('ZREVRANGEBYSCORE', grants, top, since, 'WITHSCORES', 'LIMIT', 0, 64)
  if #records == 0 then
    break
  end
  local gone = {}
  for i = 1, #records, 2 do
    local after, n = running(grants, records[i], tag)
    gone[#gone + 1] = records[i]
    if n > left then
      redis.call('ZADD', grants, records[i + 1], string.format('%016d:%d', after - left, n - left) .. tag)
      n = left
    end
    left = left - n
    if left == 0 then
      break
    end
  end
  redis.call('ZREM', grants, unpack(gone))
end
local newest = redis.call('ZREVRANGEBYSCORE', grants, top, string.format('%d', base), 'WITHSCORES', 'LIMIT', 0, 1)
if #newest > 0 then
  last = tonumber(newest[2]) - base
end

--[[@more_report]]
remaining = rate - used
if used > 0 then
  reset = (last + interval) * 1000 - NOW_US
end

--[[@admin]]
local TYPES, FIELDS = { 'string', 'zset', 'zset' }, {}

-- settle recomputes the cache from the log after a rate change.
local function settle(keys)
  local log = keys[2]
  redis.call('ZREMRANGEBYSCORE', log, '-inf', NOW_MS - interval)
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')[2]
  local reset = newest and (newest + interval) * 1000 - NOW_US or 0
  store(keys[1], log, rate - sum(log, call(log, 'ZRANGE', log, 0, -1), 1), reset > 0 and ttl(reset, stored and keepalive == 0 and KEYS[1]))
end
