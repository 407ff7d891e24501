-- Token bucket in Redisson's RRateLimiter layout (3.21+), so Java services on
-- Redisson and Go services on redlimit can share one limiter.
-- State keys: value, a string caching rate − Σ(permits in the log) (negative
-- after a rate decrease, until grants age out); permits, the log: a zset with
-- score = grant time in ms and member = 0x10, a 16-byte request id, the
-- count as uint32 LE (so a rate is below 2^32: config.go). A record at score
-- s is out of the window once s <= now − interval. grants, the log of a
-- config's further rates (see further below).
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
-- makes it exact.
--
-- Unlike the other algorithms, the state is not fields the decision writes
-- for it: its reads (load, wait, commit) and its writes (write) are its own,
-- and it keeps them in that order, so that nothing is written before the
-- decision has checked everything.
-- Cost: each command a call runs costs a fraction of a microsecond of Redis's
-- time. The value is read once and the log once (its records out of the
-- window, or all of it when the value is missing: a new limiter's first grant
-- reads an empty log once, and looks up no slice); a denial reads the newest
-- record once, for both resent and report.
-- A module of decide.lua: see there for what each function is given.

-- count is the permits of a record of log.
local function count(log, member)
  local n = #member
  if n < 5 then
    corrupt(log, 'member of ' .. n .. ' bytes')
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

-- slice_of is the length of a slice of interval, in ms.
local function slice_of(interval)
  return (interval + 63 - (interval + 63) % 64) / 64
end

-- slice finds the record a grant at now (ms) coalesces into: the newest at
-- or before the end of now's slice of interval, its score, and the slice's
-- start; the record is in the slice when its score is at or after the start.
local function slice(log, now, interval)
  local q = slice_of(interval)
  local start = now - now % q
  local newest = redis.call('ZREVRANGEBYSCORE', log, string.format('%d', start + q - 1), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  return newest[1], newest[2] and tonumber(newest[2]), start
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

-- granted holds what each grant of this call of the script left in its log,
-- by the log's key: { now (ms), interval, the value, its record, the
-- record's score, the keys' TTL (ms) }. A batch's requests share the call,
-- and one on a log that a grant of the same time and interval wrote before
-- it, with no request on the log between, finds the state as that grant
-- left it: no record out of the window, the value cached, its slice's
-- record, and both keys expiring when this grant's would (the same ms, on
-- the same server clock). A grant on a hot key then runs 4 commands fewer.
local granted = {}

local bucket = {}

function bucket.capacity(s)
  return s.rate
end

-- load reads the permits available: rate − Σ(log in the window). The value
-- key caches rate − Σ(log), as Redisson keeps it: the records that left the
-- window (aged: how many) give theirs back here, and go when the state is
-- written. When the cache is missing or impossible the log is summed again,
-- so losing it never resets the limiter; when it is missing the whole log
-- is read at once (a new limiter's first grant reads an empty log once).
-- What a grant of this call left (granted) is not read again.
-- s.changed: the cache is wrong; s.empty: the log is empty; s.newest: the
-- log's newest record and its score, once read; s.full_after: µs until the
-- bucket is full again, once known; s.seen: granted's entry for the log,
-- taken (a grant puts one back).
function bucket.load(s, _, _, now)
  local rate, interval, log, value_key = s.rate, s.interval, s.keys[2], s.keys[1]
  local now_ms = (now - now % 1000) / 1000
  s.now_ms, s.cutoff = now_ms, string.format('%d', now_ms - interval)
  local aged, available, changed, empty = 0, 0, false, false
  local seen = granted[log]
  granted[log] = nil
  if seen and (seen[1] ~= now_ms or seen[2] ~= interval) then
    seen = nil
  end
  if seen then
    available = seen[3]
    if available > rate then -- a handle of a lower rate
      available, changed = rate - sum(log, redis.call('ZRANGEBYSCORE', log, '(' .. s.cutoff, '+inf'), 1), true
    end
  else
    local got = redis.pcall('GET', value_key)
    local cached = got and tonumber(got) -- nil for an error, or what is not a number
    if got and not (cached and cached % 1 == 0 and cached >= -MAX and cached <= MAX) then
      corrupt(value_key, got.err or 'field value = ' .. string.format('%q', got))
    end
    local records
    if cached then
      records = redis.pcall('ZRANGEBYSCORE', log, '-inf', s.cutoff)
    else
      records = redis.pcall('ZRANGEBYSCORE', log, '-inf', '+inf', 'WITHSCORES')
    end
    if records.err then
      corrupt(log, records.err)
    end
    if cached then
      aged, available = #records, cached + sum(log, records, 1)
      if available > rate then
        available, changed = rate - sum(log, redis.call('ZRANGEBYSCORE', log, '(' .. s.cutoff, '+inf'), 1), true
      end
    else
      local used, out = 0, now_ms - interval
      for i = 1, #records, 2 do
        local n = count(log, records[i])
        if records[i + 1] + 0 <= out then aged = aged + 1 else used = used + n end
      end
      available, changed, empty = rate - used, true, #records == 0
    end
  end
  s.aged, s.available, s.changed, s.empty, s.seen = aged, available, changed, empty, seen
end

-- wait: enough of the oldest records in the window must age out: of one
-- permit or more each, so need records at most. When the whole window frees
-- too few, the cached value was too low (a value key without its log): the
-- log is the truth, and the value is rebuilt from it. A denial reads the
-- newest record, once, for resent and report. A decision that is no grant
-- still writes a cache it found wrong, as a Redisson client sharing the
-- limiter reads the value key alone.
function bucket.wait(s, permits, now)
  local wait, log, available = 0, s.keys[2], s.available
  if permits > available then
    local need = permits - available
    local records = redis.call('ZRANGEBYSCORE', log, '(' .. s.cutoff, '+inf', 'WITHSCORES', 'LIMIT', 0, need)
    local freed, at = sum(log, records, 2, need)
    if not at and #records / 2 < need and available ~= s.rate - freed then
      available, need = s.rate - freed, permits - (s.rate - freed)
      s.available, s.changed = available, true
      if need > 0 then
        freed, at = sum(log, records, 2, need)
      end
    end
    if at then
      wait = (records[at + 1] + s.interval) * 1000 - now
    elseif need > 0 then
      wait = s.interval * 1000 -- records of several permits each: a full interval frees them all
    end
    if wait > 0 then
      s.newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
    end
  end
  return wait
end

-- resent says whether a denied request is a re-sent script whose first run
-- was granted: its id is on the newest record up to now's slice. The log's
-- newest record, read already by wait, is that record unless it is stamped
-- past the slice (by a clock ahead).
function bucket.resent(s, id)
  local member, newest, q = nil, s.newest, slice_of(s.interval)
  if newest and (not newest[2] or newest[2] + 0 < s.now_ms - s.now_ms % q + q) then
    member = newest[1]
  else
    member = slice(s.keys[2], s.now_ms, s.interval)
  end
  return member ~= nil and string.sub(member, 2, 17) == id
end

-- commit plans a grant: it joins its slice's record (see the top), which
-- takes its time and id. A record whose id is this request's is its own
-- first run's: resent (false). write makes the plan; a record's count stays
-- within its 4 bytes, else the grant gets a record of its own.
function bucket.commit(s, permits, _, id)
  if s.available - permits <= -MAX then
    return false, 'a debt past what the value key holds exactly'
  end
  local member, score, start
  if s.seen then
    member, score, start = s.seen[4], s.seen[5], s.now_ms - s.now_ms % slice_of(s.interval)
  elseif not s.empty then
    member, score, start = slice(s.keys[2], s.now_ms, s.interval)
  end
  if member and string.sub(member, 2, 17) == id then
    s.resent = true
    return true
  end
  local n, at, merge = permits, s.now_ms, member and score >= start
  if merge then
    n = n + count(s.keys[2], member)
    merge = n <= 4294967295
    if not merge then
      n = permits
    elseif score > at then
      at = score -- a grant stamped later, by a client whose clock is ahead
    end
  end
  s.grant, s.grant_at, s.merged, s.permits = record(n, '\16' .. id), at, merge and member, permits
  s.mine = merge or not (member and score >= start)
  return true
end

-- write makes what commit or release planned, or rewrites a cache load or
-- wait found wrong (a denial of permits writes only that): the records out
-- of the window go, and the value is cached, both keys expiring when the
-- newest record ages out; after a grant of this call at the same time
-- (seen), the log's expiry stands. It returns whether the grant was
-- counted: its record is written with NX, and a member there already is
-- this request's too (alone in an older record). A grant not counted, a
-- re-sent script's, still writes a state it found wrong or aged.
function bucket.write(s, now, config)
  local log, value_key, counted = s.keys[2], s.keys[1], false
  local dirty = s.changed
  if s.grant then
    if not s.resent then
      counted = redis.call('ZADD', log, 'NX', string.format('%d', s.grant_at), s.grant) == 1
    end
    if counted then
      if s.merged then
        redis.call('ZREM', log, s.merged)
      end
      s.available, s.full_after = s.available - s.permits, (s.grant_at + s.interval) * 1000 - now
    end
    dirty = counted or s.changed or s.aged > 0
  elseif s.give then
    -- A release's or a settle's change to one record (extend's: maybe a
    -- new one, of head s.give[4]).
    local member, score, left = s.give[1], s.give[2], s.give[3]
    if member then
      redis.call('ZREM', log, member)
    end
    if left > 0 then
      redis.call('ZADD', log, score, record(left, member and string.sub(member, 1, #member - 4) or s.give[4]))
    end
    dirty = true
  end
  if not dirty then
    return counted
  end
  if s.aged > 0 then
    redis.call('ZREMRANGEBYSCORE', log, '-inf', s.cutoff)
  end
  local seen = s.seen
  s.full_after = s.full_after or time_to_full(log, s.interval, now, s.newest)
  if seen and counted then
    redis.call('SET', value_key, string.format('%d', s.available), 'PX', seen[6])
  else
    local ms = s.full_after > 0 and ttl(s.full_after, config)
    store(value_key, log, s.available, ms)
    seen = counted and { s.now_ms, s.interval, s.available, nil, nil, ms }
  end
  if counted and s.mine then
    seen[3], seen[4], seen[5] = s.available, s.grant, s.grant_at
    granted[log] = seen
  end
  return counted
end

-- report: the bucket is full again when its newest record ages out.
function bucket.report(s, now)
  return s.available, s.full_after or time_to_full(s.keys[2], s.interval, now, s.newest)
end

-- Beyond the common decision (the lean script leaves these out):
--[[@rare]]

-- own finds the record of a grant made at at µs: its slice's, while that
-- is in the window. It returns the record, its score and its permits, or
-- nil.
local function own(s, at)
  local log, q = s.keys[2], slice_of(s.interval)
  local at_ms = (at - at % 1000) / 1000
  local start = at_ms - at_ms % q
  local found = redis.call('ZREVRANGEBYSCORE', log, string.format('%d', start + q - 1), string.format('%d', start), 'WITHSCORES', 'LIMIT', 0, 1)
  if not found[1] or found[2] + 0 <= s.now_ms - s.interval then
    return nil
  end
  return found[1], found[2], count(log, found[1])
end

-- release gives back up to permits of a grant made at at µs of size permits:
-- from the record of its slice only, while that is in the window, and never
-- more than that record holds or the grant took. The record keeps its time
-- and id; the value gains what it loses.
function bucket.release(s, permits, at, size)
  local member, score, n = own(s, at)
  if not member then
    return 0
  end
  local back = math.min(permits, size, n)
  s.give = { member, score, n - back }
  s.available = s.available + back
  return back
end

-- room is what a settle may count and leave at most debt permits owed; nil
-- without a cap.
function bucket.room(s, debt)
  if not debt then
    return nil
  end
  return s.available + debt
end

-- extend counts a reservation's cost past its grant (of id's making):
-- in the grant's record while that is in the window (the cost ages out
-- with the grant), else as a grant made now would be, in now's slice's
-- record (whose time moves to now) or a record of its own, named id. A
-- record that would pass its 4 bytes is not joined. write makes the plan.
function bucket.extend(s, permits, at, _, _, id)
  if s.available - permits <= -MAX then
    return false, 'a debt past what the value key holds exactly'
  end
  local member, score, n = own(s, at)
  if not member or n + permits > 4294967295 then
    local start
    member, score, start = slice(s.keys[2], s.now_ms, s.interval)
    n = member and count(s.keys[2], member)
    if not member or score < start or n + permits > 4294967295 then
      member, n = nil, 0
    end
    if not score or score < s.now_ms then score = s.now_ms end
  end
  s.give = { member, score, n + permits, '\16' .. id }
  s.available = s.available - permits
  return true
end

-- settle recomputes the cache from the log after a rate change (the admin
-- script's set): keys are a client's state keys; config, the config's key
-- when its state must not outlive it.
function bucket.settle(keys, rate, interval, now, config)
  local log = keys[2]
  local now_ms = (now - now % 1000) / 1000
  redis.call('ZREMRANGEBYSCORE', log, '-inf', now_ms - interval)
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')[2]
  local reset = newest and (newest + interval) * 1000 - now or 0
  local records = redis.pcall('ZRANGE', log, 0, -1)
  if records.err then
    corrupt(log, records.err .. ' (ZRANGE)')
  end
  store(keys[1], log, rate - sum(log, records, 1), reset > 0 and ttl(reset, config))
end

-- A further rate cannot share Redisson's log: a Java client prunes it to the
-- first rate's interval. It keeps records of its own in the grants log,
-- each rate in a range of scores of its own: rate k's are its grants' times
-- in ms plus (k − 2) × 2^45 (2^45 ms is 1,115 years; every score stays below
-- 2^53). A member is the running total of the rate's permits after the
-- record and the record's own permits, '%016d:%d', then ':k' for k > 2, so
-- that no two rates' members are equal. Its grants coalesce by slices of its
-- interval, as the first rate's do (see the top): at most 65 records each.
-- A rate's usage is its newest total less the total before its oldest
-- record in the window: two lookups.
local further = {}

-- running reads a record of the grants log whose member ends in tag: the
-- running total of permits after it, and its own permits.
local function running(grants, member, tag)
  local total, permits = string.match(member, '^(%d+):(%d+)' .. tag .. '$')
  if not total then
    corrupt(grants, 'member ' .. string.format('%q', member))
  end
  return tonumber(total), tonumber(permits) -- not + 0: gopher-lua (miniredis) reads 010 as octal
end

further.capacity = bucket.capacity

-- load reads the rate's usage (s.used), its newest record's running total,
-- time in ms and member (s.total, s.last, s.member). s.base, s.top: the
-- rate's range of scores; s.after: the window's start, for ZRANGEBYSCORE.
function further.load(s, _, _, now)
  local grants, K = s.keys[3], s.K
  local now_ms = (now - now % 1000) / 1000
  local base = (K - 2) * 35184372088832
  s.now_ms, s.base, s.tag = now_ms, base, K == '2' and '' or ':' .. K
  s.top = '(' .. string.format('%d', base + 35184372088832)
  s.after = '(' .. string.format('%d', base + now_ms - s.interval)
  local newest = redis.pcall('ZREVRANGEBYSCORE', grants, s.top, string.format('%d', base), 'WITHSCORES', 'LIMIT', 0, 1)
  if newest.err then
    corrupt(grants, newest.err)
  end
  s.used, s.total, s.last, s.member = 0, 0, 0, nil
  if #newest > 0 then
    s.total, s.last, s.member = running(grants, newest[1], s.tag), tonumber(newest[2]) - base, newest[1]
    local oldest = redis.call('ZRANGEBYSCORE', grants, s.after, s.top, 'LIMIT', 0, 1)
    if #oldest > 0 then
      local after, n = running(grants, oldest[1], s.tag)
      s.used = s.total - (after - n)
    end
  end
end

-- wait: enough of the oldest records in the window must leave it: records
-- of one permit or more, so need records at most.
function further.wait(s, permits, now)
  local need = s.used + permits - s.rate
  if need <= 0 then
    return 0
  end
  local base_total = s.total - s.used
  local records = redis.call('ZRANGEBYSCORE', s.keys[3], s.after, s.top, 'WITHSCORES', 'LIMIT', 0, need)
  for i = 1, #records, 2 do
    if running(s.keys[3], records[i], s.tag) - base_total >= need then
      return (tonumber(records[i + 1]) - s.base + s.interval) * 1000 - now
    end
  end
  return s.interval * 1000 -- not reached: permits <= rate, so the window holds enough to free
end

-- commit counts a grant; write joins it to its slice's record, whose time
-- never goes back, so that the totals grow with the scores.
function further.commit(s, permits)
  if s.total + permits >= MAX then
    return false, 'a total past what doubles hold exactly'
  end
  s.permits = permits
  s.used, s.total = s.used + permits, s.total + permits
  return true
end

-- release gives back up to permits of a grant made at at µs of size
-- permits: from the record of its slice only, while that is in the window;
-- write takes them off it, and off the running total of every later record.
function further.release(s, permits, at, size)
  local grants, q, base = s.keys[3], slice_of(s.interval), s.base
  local at_ms = (at - at % 1000) / 1000
  local start = at_ms - at_ms % q
  local found = redis.call('ZREVRANGEBYSCORE', grants, string.format('%d', base + start + q - 1),
    string.format('%d', base + start), 'WITHSCORES', 'LIMIT', 0, 1)
  if not found[1] or found[2] - base <= s.now_ms - s.interval then
    return 0
  end
  local _, n = running(grants, found[1], s.tag)
  local back = math.min(permits, size, n)
  s.give, s.used, s.total = { found[2], back }, s.used - back, s.total - back
  return back
end

-- room is what a settle may count and leave at most debt permits over the
-- rate; nil without a cap.
function further.room(s, debt)
  if not debt then
    return nil
  end
  return s.rate - s.used + debt
end

-- extend counts a reservation's cost past its grant: in the record of its
-- slice while that is in the window (write adds it to that record's total
-- and every later one's), else as a grant made now (commit).
function further.extend(s, permits, at)
  if s.total + permits >= MAX then
    return false, 'a total past what doubles hold exactly'
  end
  local grants, q, base = s.keys[3], slice_of(s.interval), s.base
  local at_ms = (at - at % 1000) / 1000
  local start = at_ms - at_ms % q
  local found = redis.call('ZREVRANGEBYSCORE', grants, string.format('%d', base + start + q - 1),
    string.format('%d', base + start), 'WITHSCORES', 'LIMIT', 0, 1)
  if not found[1] or found[2] - base <= s.now_ms - s.interval then
    return further.commit(s, permits)
  end
  s.give, s.used, s.total = { found[2], -permits }, s.used + permits, s.total + permits
  return true
end

-- write: a new record first drops the rate's records out of its window:
-- between two new records nothing is added, so the rate never holds more
-- than 65. The grants log expires with the longest rate (s.longest).
function further.write(s, now, config)
  local grants = s.keys[3]
  if s.give then
    local from, back = s.give[1], s.give[2]
    local later = redis.call('ZRANGEBYSCORE', grants, from, s.top, 'WITHSCORES')
    for i = 1, #later, 2 do
      local after, n = running(grants, later[i], s.tag)
      if i == 1 then n = n - back end
      redis.call('ZREM', grants, later[i])
      if n > 0 then
        redis.call('ZADD', grants, later[i + 1], string.format('%016d:%d', after - back, n) .. s.tag)
      end
    end
    local newest = redis.call('ZREVRANGEBYSCORE', grants, s.top, string.format('%d', s.base), 'WITHSCORES', 'LIMIT', 0, 1)
    if #newest > 0 then s.last = tonumber(newest[2]) - s.base end
    return
  end
  if not s.permits then
    return
  end
  local grants, q, n = s.keys[3], slice_of(s.interval), s.permits
  if s.member and s.last >= s.now_ms - s.now_ms % q then
    local _, had = running(grants, s.member, s.tag)
    n = n + had
    redis.call('ZREM', grants, s.member)
  else
    redis.call('ZREMRANGEBYSCORE', grants, string.format('%d', s.base), string.format('%d', s.base + s.now_ms - s.interval))
  end
  if s.last < s.now_ms then s.last = s.now_ms end
  redis.call('ZADD', grants, string.format('%d', s.base + s.last), string.format('%016d:%d', s.total, n) .. s.tag)
  if s.K == '2' then
    redis.call('PEXPIRE', grants, ttl((s.last + s.longest) * 1000 - now, config))
  end
end

function further.report(s, now)
  local reset = 0
  if s.used > 0 then
    reset = (s.last + s.interval) * 1000 - now
  end
  return s.rate - s.used, reset
end

bucket.FURTHER = further
return bucket
