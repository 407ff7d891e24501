-- Dispatch, after the algorithm's file has defined allow, release, settle
-- (or nil) and TYPES (the Redis type of each state key). Decisions return at
-- once; the admin ops' helpers below are only created when one is asked for.

local function state_keys(group) -- 0: shared, 1: this client's, k ≥ 2: the (k-1)th other's
  local keys = {}
  for i = 1, N do
    keys[i] = KEYS[3 + group * N + i]
  end
  return keys
end

local op = ARGV[1]
if op == 'allow' or op == 'release' then
  local cfg = config()
  if cfg.stored and cfg.keepalive > 0 and ARGV[3] ~= '0' then
    -- Every acquire keeps the config alive, granted or denied: a saturated
    -- limiter is busy, not idle.
    redis.call('PEXPIRE', KEYS[1], cfg.keepalive)
  end
  local act = allow
  if op == 'release' then act = release end
  return act(cfg, state_keys(cfg.type), tonumber(ARGV[3]))
end

local function all_state_keys()
  local keys = {}
  for i = 4, #KEYS do
    keys[#keys + 1] = KEYS[i]
  end
  return keys
end

-- missing_clients lists registered clients whose keys the caller did not pass:
-- the ops that act on every client's keys get them from the caller, which
-- asks again with the missing ones.
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

local function delete_state()
  redis.call('DEL', KEYS[2], unpack(all_state_keys()))
end

local function write_config(cfg)
  redis.call('HSET', KEYS[1], 'rate', ARGV[8], 'interval', ARGV[9], 'type', ARGV[10], 'keepAliveTime', ARGV[13])
  if ALGORITHM ~= 'tokenbucket' then
    redis.call('HSET', KEYS[1], 'algorithm', ALGORITHM)
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

-- cap_expiry gives every key a TTL of at most ttl_ms, keeping shorter ones,
-- and reports whether any key exists.
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

if op == 'get' then
  local cfg = stored_config()
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
if op == 'persist' then
  return redis.call('PERSIST', KEYS[1])
end

-- The ops below act on every client's keys.
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
  local keys = all_state_keys()
  table.insert(keys, 1, KEYS[1])
  table.insert(keys, 2, KEYS[2])
  return cap_expiry(keys, tonumber(ARGV[3]))
end
if op == 'set' or op == 'tryset' then
  local old = stored_config()
  if old and op == 'tryset' then
    return 0
  end
  local new = given_config()
  -- Check every state key before writing anything: bad state leaves all as it was.
  for i = 4, #KEYS do
    local t = redis.call('TYPE', KEYS[i])['ok']
    local want = TYPES[(i - 4) % N + 1]
    if t ~= 'none' and t ~= want then
      fail('corrupt ' .. KEYS[i] .. ': a ' .. t .. ', not a ' .. want)
    end
  end
  write_config(new)
  new.stored = true
  if old and old.type ~= new.type then
    delete_state() -- usage under one type means nothing under the other
  elseif settle then
    for group = 0, (#KEYS - 3) / N - 1 do
      settle(new, state_keys(group))
    end
  end
  return 1
end
fail('unknown op ' .. op)
