-- Token bucket in Redisson's RRateLimiter layout (3.21+), so Java services on
-- Redisson and Go services on redlimit can share one limiter.
-- State keys: value, a string caching rate − Σ(permits in the log) (negative
-- after a rate decrease, until grants age out); permits, the log: a zset with
-- score = grant time in ms and member = 0x10, 16 id bytes, count as uint32 LE.
-- A record at score s is out of the window once s <= now − interval.
-- allow replies {allowed, limit, remaining, retry after µs, reset after µs}.

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
  return '\16' .. ARGV[5] .. string.char(permits % 256, math.floor(permits / 256) % 256,
    math.floor(permits / 65536) % 256, math.floor(permits / 16777216) % 256)
end

-- available returns rate − Σ(log in the window), dropping aged records when
-- write is set. The value key is a cache of it; when the cache is missing or
-- impossible the log is summed again, so losing it never resets the limiter.
local function available(cfg, keys, write)
  local value_key, log = keys[1], keys[2]
  local cutoff = NOW_MS - cfg.interval
  local aged = sum(log, call(log, 'ZRANGEBYSCORE', log, '-inf', cutoff))
  if write and aged > 0 then
    redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  end
  local value = integer(value_key, 'value', call(value_key, 'GET', value_key), -MAX, MAX)
  if value == nil or value + aged > cfg.rate then
    return cfg.rate - sum(log, call(log, 'ZRANGEBYSCORE', log, '(' .. cutoff, '+inf')), true
  end
  return value + aged, aged > 0
end

-- reset_after is the time until the newest record ages out and the bucket is full.
local function reset_after(cfg, log)
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if #newest == 0 then
    return 0
  end
  return (tonumber(newest[2]) + cfg.interval) * 1000 - NOW_US
end

-- save stores the new cache value, with both keys expiring when the log
-- empties, reset µs from now.
local function save(cfg, keys, value, reset)
  if reset <= 0 then
    redis.call('DEL', keys[1], keys[2])
    return
  end
  local ttl = expiry(cfg, reset / 1000)
  redis.call('SET', keys[1], value, 'PX', ttl)
  redis.call('PEXPIRE', keys[2], ttl)
end

-- retry_after walks the log from the oldest record until enough permits free
-- up. It returns nil when the whole log frees too few: the cached value was
-- too low (a value key without its log), and the log is the truth.
local function retry_after(cfg, log, need)
  local freed = 0
  local records = redis.call('ZRANGE', log, 0, need - 1, 'WITHSCORES')
  for i = 1, #records, 2 do
    freed = freed + count_of(log, records[i])
    if freed >= need then
      return (tonumber(records[i + 1]) + cfg.interval) * 1000 - NOW_US
    end
  end
  if #records / 2 < need then
    return nil, cfg.rate - freed
  end
  return cfg.interval * 1000 -- records of several permits each: a full interval frees them all
end

local function allow(cfg, keys, permits)
  local log = keys[2]
  local write = permits > 0
  local value, changed = available(cfg, keys, write)
  local allowed, retry, reset = 0, 0, nil
  if permits > cfg.rate then
    retry = -1
  else
    if permits > value then
      local rebuilt
      retry, rebuilt = retry_after(cfg, log, permits - value)
      if retry == nil then
        value, changed, retry = rebuilt, true, 0
        if permits > value then
          retry = retry_after(cfg, log, permits - value)
        end
      end
    end
    if permits <= value then
      allowed = 1
      -- ZADD NX both records the grant and detects a re-sent request, whose
      -- record (same id, same member) is in the log already.
      if write and redis.call('ZADD', log, 'NX', NOW_MS, record(permits)) == 1 then
        value = value - permits
        changed = true
        reset = (NOW_MS + cfg.interval) * 1000 - NOW_US
        touch(cfg)
      end
    elseif write and redis.call('ZSCORE', log, record(permits)) then
      allowed, retry = 1, 0 -- a re-sent request whose first run was granted
    end
  end
  reset = reset or reset_after(cfg, log)
  if write and changed then
    save(cfg, keys, value, reset)
  end
  return { allowed, cfg.rate, math.max(0, math.min(value, cfg.rate)), retry, reset }
end

-- release gives back up to permits, taking them off the newest records so
-- that the log and the value stay in agreement.
local function release(cfg, keys, permits)
  local log = keys[2]
  if not first_run() then
    return 0
  end
  local value = available(cfg, keys, true)
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
  save(cfg, keys, value + permits - left, reset_after(cfg, log))
  return permits - left
end

-- settle recomputes the cache from the log after a rate change.
local function settle(cfg, keys)
  local log = keys[2]
  redis.call('ZREMRANGEBYSCORE', log, '-inf', NOW_MS - cfg.interval)
  save(cfg, keys, cfg.rate - sum(log, call(log, 'ZRANGE', log, 0, -1)), reset_after(cfg, log))
end

local TYPES = { 'string', 'zset' }
