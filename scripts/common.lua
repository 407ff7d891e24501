-- The hot path shared by every algorithm. script.go loads, as one script:
-- a header naming the algorithm (ALGORITHM, N = its state keys per client),
-- this file, the algorithm's file, then admin.lua, which dispatches ARGV[1].
-- Only what a decision needs is defined before that dispatch: Redis runs the
-- whole chunk on every call, and each closure it creates costs time.
--
-- KEYS[1]  config hash (Redisson layout: rate, interval ms, type, keepAliveTime ms)
-- KEYS[2]  client registry: zset of PerClient ids, score = last grant in ms
-- KEYS[3]  this request's replay marker (see first_run)
-- KEYS[4 ..]  N state keys shared by all clients, then N keys of this client,
--             then N keys of each client named in ARGV[14 ..] (admin ops)
-- ARGV[1]  op: allow | release | get | set | tryset | reset | delete | expire | persist | ttl
-- ARGV[2]  now in µs, or '' to read Redis TIME
-- ARGV[3]  permits (allow, release) or milliseconds (expire)
-- ARGV[4]  client id
-- ARGV[5]  request id ('' for none)
-- ARGV[6]  how long a request id is remembered, ms
-- ARGV[7]  where ARGV[8 .. 13] come from: '' (nothing), 'default', 'fixed' (ignore the hash), 'new' (set)
-- ARGV[8 .. 13]  rate, interval ms, type, burst, buckets, keep-alive ms
-- ARGV[14 ..]  other clients' ids (admin ops)
--
-- Every number written or returned is an integer: Lua numbers are doubles and
-- Redis truncates returned floats. Errors are raised as plain strings
-- 'REDLIMIT …' at level 0 (no position); Redis and miniredis wrap them each
-- their own way, and script.go takes the message back out. (No pcall around
-- the script to return them cleanly: it costs more than the rest of a call.)

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
  NOW_US = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  NOW_US = tonumber(ARGV[2])
end
local NOW_MS = math.floor(NOW_US / 1000)
local MAX = 9007199254740992 -- 2^53

-- integer parses a stored field: a whole number within [min, max], or nil when absent.
local function integer(key, field, value, min, max)
  if not value then
    return nil
  end
  local n = tonumber(value)
  if n == nil or n ~= math.floor(n) or n < min or n > max then
    fail('corrupt ' .. key .. ': field ' .. field .. ' = ' .. string.format('%q', value))
  end
  return n
end

-- config_from reads f = {rate, interval, type, burst, buckets, keepalive} from
-- the hash (stored) or the arguments, defaults applied.
local function config_from(key, f, stored)
  local cfg = {
    rate = integer(key, 'rate', f[1], 1, MAX),
    interval = integer(key, 'interval', f[2], 1, MAX),
    type = integer(key, 'type', f[3], 0, 1) or 0,
    burst = integer(key, 'burst', f[4], 0, MAX) or 0,
    buckets = integer(key, 'buckets', f[5], 0, 1000) or 0,
    keepalive = integer(key, 'keepAliveTime', f[6], 0, MAX) or 0,
    stored = stored,
  }
  if cfg.rate == nil or cfg.interval == nil then
    fail('corrupt ' .. key .. ': rate or interval missing')
  end
  if cfg.burst == 0 then cfg.burst = cfg.rate end
  if cfg.buckets == 0 then cfg.buckets = 10 end
  if cfg.buckets > cfg.interval or cfg.rate > cfg.interval * 1000 then
    fail('corrupt ' .. key .. ': rate or buckets too fine for the interval')
  end
  return cfg
end

-- stored_config returns the config hash's config, or nil when there is none.
local function stored_config()
  local f = call(KEYS[1], 'HMGET', KEYS[1], 'rate', 'interval', 'type', 'burst', 'buckets', 'keepAliveTime', 'algorithm')
  if not f[1] and not f[2] then
    return nil
  end
  if (f[7] or 'tokenbucket') ~= ALGORITHM then
    fail('algorithm ' .. KEYS[1] .. ' holds a ' .. (f[7] or 'tokenbucket') .. ' config, not ' .. ALGORITHM)
  end
  return config_from(KEYS[1], f, true)
end

local function given_config()
  return config_from('arguments', { ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13] }, false)
end

-- config: stored in Redis > the handle's default > not initialized.
local function config()
  local source = ARGV[7]
  if source ~= 'fixed' then
    local cfg = stored_config()
    if cfg then return cfg end
  end
  if source == '' then
    fail('not initialized ' .. KEYS[1])
  end
  return given_config()
end

-- expiry caps a state key's TTL so that no key outlives the config hash.
local function expiry(cfg, ttl_ms)
  ttl_ms = math.max(1, math.ceil(ttl_ms))
  if cfg.stored and cfg.keepalive == 0 then
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 and left < ttl_ms then
      return left
    end
  end
  return ttl_ms
end

-- lifetime bounds how long any state of cfg matters, in ms: one interval, or the
-- time a funnel takes to drain when its burst exceeds its rate.
local function lifetime(cfg)
  return math.max(cfg.interval, math.ceil(cfg.burst * cfg.interval / cfg.rate))
end

-- touch runs after each grant: the registry lets Delete, Reset and Expire
-- reach every client's keys.
local function touch(cfg)
  if cfg.type == 1 then
    call(KEYS[2], 'ZADD', KEYS[2], NOW_MS, ARGV[4])
    redis.call('PEXPIRE', KEYS[2], expiry(cfg, lifetime(cfg)))
  end
end

-- A client re-sends a script whose reply it did not read (go-redis does on a
-- read timeout), so a grant leaves a marker that lets a re-run see it. One
-- command both checks and sets it: first_run is false for a re-run, whose
-- grant must not be counted again. replayed checks without setting, for
-- requests about to be denied (their first run may have been granted).
local function first_run()
  return ARGV[5] == '' or redis.call('SET', KEYS[3], '1', 'PX', ARGV[6], 'NX') ~= false
end

local function replayed()
  return ARGV[5] ~= '' and redis.call('EXISTS', KEYS[3]) == 1
end
