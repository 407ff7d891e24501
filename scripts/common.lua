-- Shared by every algorithm: script.go loads this file followed by one
-- algorithm's file, which ends with `return run(algorithm)`.
--
-- KEYS[1]  config hash (Redisson layout: rate, interval ms, type, keepAliveTime ms)
-- KEYS[2]  client registry: zset of PerClient ids, score = last grant in ms
-- KEYS[3]  this request's replay marker (see remember_request)
-- KEYS[4 ..]  the algorithm's N state keys shared by all clients, then N keys of
--             this client, then N keys of each client named in ARGV[14 ..]
-- ARGV[1]  op: allow | release | get | set | tryset | clients | reset | delete | expire | persist | ttl
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
-- Redis truncates returned floats.

local N -- state keys per client, set by run

-- fail aborts the script with a clean error reply (see run). A plain string at
-- level 0: Redis 7 turns error tables caught by pcall into strings anyway.
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

local function now_us()
  if ARGV[2] ~= '' then
    return tonumber(ARGV[2])
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local NOW_US = now_us()
local NOW_MS = math.floor(NOW_US / 1000)

-- integer parses a stored field: a whole number within [min, max], or nil when absent.
local function integer(key, field, value, min, max)
  if value == false or value == nil then
    return nil
  end
  local n = tonumber(value)
  if n == nil or n ~= math.floor(n) or n < min or n > max then
    fail('corrupt ' .. key .. ': field ' .. field .. ' = ' .. string.format('%q', value))
  end
  return n
end

local MAX = 9007199254740992 -- 2^53

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

local function stored_config(algorithm)
  local f = call(KEYS[1], 'HMGET', KEYS[1], 'rate', 'interval', 'type', 'burst', 'buckets', 'keepAliveTime', 'algorithm')
  if f[1] == false and f[2] == false then
    return nil
  end
  if (f[7] or 'tokenbucket') ~= algorithm then
    fail('algorithm ' .. KEYS[1] .. ' holds a ' .. (f[7] or 'tokenbucket') .. ' config, not ' .. algorithm)
  end
  return config_from(KEYS[1], f, true)
end

local function given_config()
  return config_from('arguments', { ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13] }, false)
end

-- config: stored in Redis > the handle's default > not initialized.
local function config(algorithm)
  local source = ARGV[7]
  if source ~= 'fixed' then
    local cfg = stored_config(algorithm)
    if cfg then return cfg end
  end
  if source == '' then
    fail('not initialized ' .. KEYS[1])
  end
  return given_config()
end

-- state_keys returns the keys of one client: 0 the shared ones, 1 this client's, k ≥ 2 the (k-1)th other.
local function state_keys(group)
  local keys = {}
  for i = 1, N do
    keys[i] = KEYS[3 + group * N + i]
  end
  return keys
end

local function groups()
  return (#KEYS - 3) / N
end

-- lifetime bounds how long any state of cfg matters, in ms: one interval, or the
-- time a funnel takes to drain when its burst exceeds its rate.
local function lifetime(cfg)
  return math.max(cfg.interval, math.ceil(cfg.burst * cfg.interval / cfg.rate))
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

-- touch runs after each grant: keep-alive, and the registry that lets Delete,
-- Reset and Expire reach every client's keys.
local function touch(cfg)
  if cfg.stored and cfg.keepalive > 0 then
    redis.call('PEXPIRE', KEYS[1], cfg.keepalive)
  end
  if cfg.type == 1 then
    call(KEYS[2], 'ZADD', KEYS[2], NOW_MS, ARGV[4])
    redis.call('PEXPIRE', KEYS[2], expiry(cfg, lifetime(cfg)))
  end
end

-- A client re-sends a script whose reply it did not read (go-redis does on a
-- read timeout). The marker lets the re-run see that its grant already happened.
local function replayed()
  return ARGV[5] ~= '' and redis.call('EXISTS', KEYS[3]) == 1
end

local function remember_request()
  if ARGV[5] ~= '' then
    redis.call('SET', KEYS[3], '1', 'PX', ARGV[6])
  end
end

-- missing_clients lists registered clients whose keys the caller did not pass.
local function missing_clients()
  local given = {}
  for i = 14, #ARGV do
    given[ARGV[i]] = true
  end
  local missing = {}
  for _, id in ipairs(call(KEYS[2], 'ZRANGE', KEYS[2], 0, -1)) do
    if not given[id] and id ~= ARGV[4] then
      missing[#missing + 1] = id
    end
  end
  return missing
end

local function all_state_keys()
  local keys = {}
  for i = 4, #KEYS do
    keys[#keys + 1] = KEYS[i]
  end
  return keys
end

local function delete_state()
  redis.call('DEL', KEYS[2], unpack(all_state_keys()))
end

local function write_config(algorithm, cfg)
  redis.call('HSET', KEYS[1], 'rate', ARGV[8], 'interval', ARGV[9], 'type', ARGV[10], 'keepAliveTime', ARGV[13])
  if algorithm ~= 'tokenbucket' then
    redis.call('HSET', KEYS[1], 'algorithm', algorithm)
  end
  for _, f in ipairs({ { 'burst', ARGV[11] }, { 'buckets', ARGV[12] } }) do
    if f[2] == '0' then
      redis.call('HDEL', KEYS[1], f[1])
    else
      redis.call('HSET', KEYS[1], f[1], f[2])
    end
  end
  if cfg.keepalive > 0 then
    redis.call('PEXPIRE', KEYS[1], cfg.keepalive)
  else
    redis.call('PERSIST', KEYS[1])
  end
end

-- cap_expiry gives every key a TTL of at most ttl_ms, keeping shorter ones.
local function cap_expiry(keys, ttl_ms)
  local any = 0
  for _, key in ipairs(keys) do
    local left = redis.call('PTTL', key)
    if left == -1 or left > ttl_ms then
      any = any + redis.call('PEXPIRE', key, ttl_ms)
    elseif left >= 0 then
      any = 1
    end
  end
  return math.min(any, 1)
end

local function admin(algorithm, op)
  if op == 'get' then
    local cfg = stored_config(algorithm.name)
    if not cfg then return {} end
    local f = redis.call('HMGET', KEYS[1], 'rate', 'interval', 'type', 'burst', 'buckets', 'keepAliveTime')
    return { tonumber(f[1]), tonumber(f[2]), tonumber(f[3] or 0), tonumber(f[4] or 0), tonumber(f[5] or 0), tonumber(f[6] or 0) }
  end
  if op == 'ttl' then
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl ~= -2 then return ttl end
    for _, key in ipairs(all_state_keys()) do
      ttl = math.max(ttl, redis.call('PTTL', key))
    end
    return ttl
  end
  if op == 'clients' then
    return call(KEYS[2], 'ZRANGE', KEYS[2], 0, -1)
  end
  if op == 'persist' then
    return redis.call('PERSIST', KEYS[1])
  end
  -- The ops below act on every client's keys: the caller lists the clients it
  -- knows; when the registry holds more, it asks again with them.
  local missing = missing_clients()
  if #missing > 0 then
    return { 'missing', missing }
  end
  if op == 'reset' then
    delete_state()
    return 1
  end
  if op == 'delete' then
    return math.min(1, redis.call('DEL', KEYS[1], KEYS[2], unpack(all_state_keys())))
  end
  if op == 'expire' then
    local ttl = tonumber(ARGV[3])
    local keys = all_state_keys()
    table.insert(keys, 1, KEYS[1])
    table.insert(keys, 2, KEYS[2])
    return cap_expiry(keys, ttl)
  end
  if op == 'set' or op == 'tryset' then
    local old = stored_config(algorithm.name)
    if old and op == 'tryset' then
      return 0
    end
    local new = given_config()
    -- Check every state key before writing anything: bad state leaves all as it was.
    for i = 4, #KEYS do
      local t = redis.call('TYPE', KEYS[i])['ok']
      local want = algorithm.types[(i - 4) % N + 1]
      if t ~= 'none' and t ~= want then
        fail('corrupt ' .. KEYS[i] .. ': a ' .. t .. ', not a ' .. want)
      end
    end
    write_config(algorithm.name, new)
    new.stored = true
    if old and old.type ~= new.type then
      delete_state() -- usage under one type means nothing under the other
    elseif algorithm.settle then
      for group = 0, groups() - 1 do
        algorithm.settle(new, state_keys(group))
      end
    end
    return 1
  end
  fail('unknown op ' .. op)
end

-- run dispatches ARGV[1] to the algorithm or to the admin ops above.
-- algorithm: { name, keys (state keys per client), types (their Redis types), allow(cfg, keys, permits),
-- release(cfg, keys, permits), settle(cfg, keys) (optional, after a rate change) }
local function run(algorithm)
  N = algorithm.keys
  local ok, reply = pcall(function()
    local op = ARGV[1]
    if op ~= 'allow' and op ~= 'release' then
      return admin(algorithm, op)
    end
    local cfg = config(algorithm.name)
    local keys = state_keys(cfg.type)
    local permits = tonumber(ARGV[3])
    if op == 'release' then
      return algorithm.release(cfg, keys, permits)
    end
    return algorithm.allow(cfg, keys, permits)
  end)
  if not ok then
    if type(reply) == 'string' and string.sub(reply, 1, 9) == 'REDLIMIT ' then
      return redis.error_reply(reply)
    end
    error(reply)
  end
  return reply
end
