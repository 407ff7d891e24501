-- The decision skeleton every algorithm plugs into. script.go loads, as one
-- script: a header from Go (local ALGORITHM, N = its stored name, its state
-- keys per client), this file, the algorithm's file, which fills in the
-- `algorithm` table below, and admin.lua, which dispatches ARGV[1]. Redis runs
-- the whole chunk on every call, so only what a decision uses is defined
-- before that dispatch, and a decision builds few tables.
--
-- KEYS[1]  the limiter's hash: its config (rate, interval ms, type and
--          keepAliveTime ms as Redisson keeps them; burst, buckets and
--          algorithm for ours) and, when the algorithm keeps its state in hash
--          fields (algorithm.fields), the Overall state too
-- KEYS[2]  client registry: zset of PerClient ids, score = last grant in ms
-- KEYS[3]  request log: zset of recent request ids, score = when forgotten in ms
-- KEYS[4 ..]  state keys, group by group (see state_keys): the Overall ones
--          (none when they live in KEYS[1]), this client's, then those of
--          each client named in ARGV[14 ..]
-- ARGV[1]  op: allow | release | get | set | tryset | reset | delete | expire | persist | ttl | clients
-- ARGV[2]  now in µs, or '' to read Redis TIME
-- ARGV[3]  permits (allow, release) or milliseconds (expire)
-- ARGV[4]  client id
-- ARGV[5]  request id: the token bucket's record; logged when ARGV[6] is set
-- ARGV[6]  how long the request log keeps an id, ms; '' for no log
-- ARGV[7]  where the config comes from: '' (stored), 'default' (stored, else
--          ARGV[8 .. 13]), 'fixed' (ARGV[8 .. 13], whatever is stored), 'new' (set)
-- ARGV[8 .. 13]  rate, interval ms, type, burst, buckets, keep-alive ms
-- ARGV[14 ..]  other clients' ids (admin ops)
--
-- Every number written or returned is an integer: Lua numbers are doubles and
-- Redis truncates returned floats. Errors are raised as plain strings
-- 'REDLIMIT …' at level 0 (no position); Redis and miniredis wrap them each
-- their own way, and script.go takes the message back out. (No pcall around
-- the script to return them cleanly: it costs more than the rest of a call.)
--
-- The decision path is written for Redis's time: each function call costs
-- about as much as a small Redis command, so it uses operators where a call
-- would do (x - x % 1 for floor, ARGV[i] + 0 for tonumber), and trusts the
-- numbers Go sends; what Redis stores is checked.

local function fail(why)
  error('REDLIMIT ' .. why, 0)
end

-- call runs a command on key and turns a type error into a clear one naming the key.
local function call(key, ...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    fail('corrupt ' .. key .. ': ' .. reply.err)
  end
  return reply
end

local NOW_US
if ARGV[2] == '' then
  local t = redis.call('TIME')
  NOW_US = t[1] * 1000000 + t[2]
else
  NOW_US = ARGV[2] + 0
end
local NOW_MS = (NOW_US - NOW_US % 1000) / 1000
local MAX = 9007199254740992 -- 2^53

-- integer parses a stored field: a whole number within [min, max], or nil when absent.
local function integer(key, field, value, min, max)
  if not value then
    return nil
  end
  local n = tonumber(value)
  if n == nil or n % 1 ~= 0 or n < min or n > max then
    fail('corrupt ' .. key .. ': field ' .. field .. ' = ' .. string.format('%q', value))
  end
  return n
end

-- The algorithm's file fills this in:
--   fields     the names of its state's hash fields; nil when it keeps its
--              own keys (the token bucket)
--   capacity   the config field that bounds one request: 'rate' or 'burst'
--   load       (cfg, where, ...) the state as of now: where is the hash
--              holding it and ... the stored values of its fields; for the
--              token bucket, where is its keys and ... nothing
--   wait       (cfg, s, permits) 0 when permits fit now, else the µs until they do
--   commit     (cfg, s, permits) records a grant; false when this request's
--              grant is recorded already (a re-sent script)
--   report     (cfg, s) remaining permits, and µs until the limiter is full
--   resent     (s, permits) optional: whether a re-sent script was granted
--   release    (cfg, s, permits) gives permits back, returns how many
--   settle     (cfg, keys) optional: brings a group's state in line after SetRate
--   types      the Redis type of each state key, for SetRate's checks
local algorithm = { capacity = 'rate' }

-- stored_config makes a config of the hash's fields f (HMGET order): every
-- one is checked, as anything may have written them.
local function stored_config(f)
  local key = KEYS[1]
  local cfg = {
    rate = integer(key, 'rate', f[1], 1, MAX),
    interval = integer(key, 'interval', f[2], 1, MAX),
    type = integer(key, 'type', f[3], 0, 1) or 0,
    burst = integer(key, 'burst', f[4], 0, MAX) or 0,
    buckets = integer(key, 'buckets', f[5], 0, 1000) or 0,
    keepalive = integer(key, 'keepAliveTime', f[6], 0, MAX) or 0,
    stored = true,
  }
  if cfg.rate == nil or cfg.interval == nil then
    fail('corrupt ' .. key .. ': rate or interval missing')
  end
  if cfg.burst == 0 then cfg.burst = cfg.rate end
  if cfg.buckets == 0 then cfg.buckets = 10 end
  if cfg.buckets > cfg.interval or cfg.rate > cfg.interval * 1000 then
    fail('corrupt ' .. key .. ': rate or buckets too fine for the interval')
  end
  if (f[7] or 'tokenbucket') ~= ALGORITHM then
    fail('algorithm ' .. key .. ' holds a ' .. (f[7] or 'tokenbucket') .. ' config, not ' .. ALGORITHM)
  end
  return cfg
end

-- read_config reads the limiter's hash once: it returns the stored config
-- (nil when there is none) and what HMGET read, whose positions from 8 on
-- are the Overall state's fields.
local function read_config()
  local f = redis.pcall('HMGET', KEYS[1], 'rate', 'interval', 'type', 'burst', 'buckets', 'keepAliveTime',
    'algorithm', unpack(algorithm.fields or {}))
  if f.err then
    fail('corrupt ' .. KEYS[1] .. ': ' .. f.err)
  end
  if not f[1] and not f[2] and not f[7] then
    return nil, f
  end
  return stored_config(f), f
end

-- config: stored in Redis > the handle's default > not initialized. It
-- returns the config in force, what read_config read, and the stored config.
-- A 'fixed' config (Throttle) ignores a stored one, but leaves its expiry
-- be; a 'new' one (SetRate) is about to replace it. A given config is in
-- ARGV[8 .. 13], which Go has checked.
local function config()
  local source = ARGV[7]
  local stored, f = read_config()
  if source ~= 'fixed' and source ~= 'new' then
    if stored then return stored, f, stored end
    if source == '' then
      fail('not initialized ' .. KEYS[1])
    end
  end
  local given = {
    rate = ARGV[8] + 0, interval = ARGV[9] + 0, type = ARGV[10] + 0,
    burst = ARGV[11] + 0, buckets = ARGV[12] + 0, keepalive = ARGV[13] + 0,
    stored = stored ~= nil,
  }
  if given.burst == 0 then given.burst = given.rate end
  if given.buckets == 0 then given.buckets = 10 end
  return given, f, stored
end

-- expiry converts a state key's TTL in µs to whole ms, rounding up. For a
-- separate key, it caps the TTL so that no key outlives a stored config
-- (Expire, ExpireAt); state in KEYS[1] needs no cap.
local function expiry(cfg, ttl_us, key)
  local ttl_ms = (ttl_us + (-ttl_us) % 1000) / 1000
  if ttl_ms < 1 then ttl_ms = 1 end
  if key ~= KEYS[1] and cfg.stored and cfg.keepalive == 0 then
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 and left < ttl_ms then
      return left
    end
  end
  return ttl_ms
end

-- save writes state fields (name, value, …) to the hash key and has it
-- expire when the limiter is full again, ttl_us from now; a nil ttl_us keeps
-- the expiry the key has (the windows set it once per window, not per grant).
-- KEYS[1] holding a stored config keeps the config's expiry (none, Expire's,
-- or the keep-alive the dispatch refreshes).
local function save(cfg, key, ttl_us, ...)
  redis.call('HSET', key, ...)
  if ttl_us == nil then
    return
  elseif key ~= KEYS[1] then
    redis.call('PEXPIRE', key, expiry(cfg, ttl_us, key))
  elseif not cfg.stored then
    local ttl_ms = (ttl_us + (-ttl_us) % 1000) / 1000 -- expiry's rounding, without its call
    if ttl_ms < 1 then ttl_ms = 1 end
    redis.call('PEXPIRE', key, ttl_ms)
  end
end

-- A client re-sends a script whose reply it did not read (go-redis does on a
-- read timeout). Counting it twice only denies sooner, so by default nothing
-- guards against it. With WithRetryWindow, the request log remembers each
-- request id for the window: first_run both checks and records the id, and
-- is false for a re-run, whose grant is counted already. (The token bucket
-- needs no log for its grants: its record holds the id.)
local function first_run()
  if ARGV[6] == '' then
    return true
  end
  if call(KEYS[3], 'ZADD', KEYS[3], 'NX', NOW_MS + ARGV[6], ARGV[5]) == 0 then
    return false
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', NOW_MS)
  redis.call('PEXPIRE', KEYS[3], ARGV[6])
  return true
end

-- decide is every algorithm's allow, on s, the state algorithm.load read.
-- It returns the reply, and the µs until the limiter is full again. The
-- reply is 'allowed limit remaining retry reset window', six integers in one string
-- (one reply value for the client to read, not six): allowed 0 or 1, retry
-- after µs (-1: never), reset after µs, window ms, the span limit applies
-- to: the interval, or the time a funnel's burst takes to drain. Zero
-- permits is a peek: it writes nothing.
local function decide(cfg, s, permits)
  local limit = cfg[algorithm.capacity]
  local allowed, retry = 0, 0
  if permits > limit then
    retry = -1
  else
    local wait = algorithm.wait(cfg, s, permits)
    if wait <= 0 then
      allowed = 1
      if permits > 0 and (algorithm.resent or ARGV[6] == '' or first_run()) and algorithm.commit(cfg, s, permits)
          and cfg.type == 1 then
        -- The registry lets Delete, Reset and Expire reach every client's
        -- keys. It lives as long as any client's state can: one interval, or
        -- the time a funnel takes to drain when its burst exceeds its rate.
        call(KEYS[2], 'ZADD', KEYS[2], NOW_MS, ARGV[4])
        local life = cfg.interval
        if cfg.burst > cfg.rate then life = cfg.burst * cfg.interval / cfg.rate end
        redis.call('PEXPIRE', KEYS[2], expiry(cfg, life * 1000, KEYS[2]))
      end
    elseif permits > 0 and (algorithm.resent and algorithm.resent(s, permits)
        or ARGV[6] ~= '' and redis.call('ZSCORE', KEYS[3], ARGV[5])) then
      allowed = 1 -- a re-sent script whose first run was granted
    else
      retry = wait
    end
  end
  local remaining, reset = algorithm.report(cfg, s)
  if remaining > limit then remaining = limit elseif remaining < 0 then remaining = 0 end
  local window = limit * cfg.interval / cfg.rate
  return string.format('%d %d %d %d %d %d', allowed, limit, remaining, retry, reset, window + (-window) % 1), reset
end
