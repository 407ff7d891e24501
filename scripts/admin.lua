-- Dispatch. Decisions return at once; the admin ops' helpers below are only
-- created when one is asked for.

local op = ARGV[1]
if op == 'allow' or op == 'release' then
  local cfg, f = config()
  local fields, s = algorithm.fields, nil
  if not fields then
    local keys = {}
    for i = 1, N do
      keys[i] = KEYS[3 + cfg.type * N + i]
    end
    s = algorithm.load(cfg, keys)
  elseif cfg.type == 0 then
    s = algorithm.load(cfg, KEYS[1], unpack(f, 8, 7 + #fields))
  else
    s = algorithm.load(cfg, KEYS[4], unpack(call(KEYS[4], 'HMGET', KEYS[4], unpack(fields)), 1, #fields))
  end
  local permits = ARGV[3] + 0
  local reply, reset = 0, 0
  if op == 'allow' then
    reply, reset = decide(cfg, s, permits)
  elseif first_run() then
    reply = algorithm.release(cfg, s, permits)
  end
  if cfg.stored and cfg.keepalive > 0 and permits > 0 then
    -- Every acquire keeps the config alive, granted or denied: a saturated
    -- limiter is busy, not idle. State in the config hash keeps it alive as
    -- long as the state counts (a funnel whose burst drains slower).
    local ttl = cfg.keepalive
    if op == 'allow' and fields and cfg.type == 0 then
      ttl = math.max(ttl, math.ceil(reset / 1000))
    end
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return reply
end

-- state_keys returns a group's state keys: group 0 holds the Overall state,
-- group 1 this client's, group k ≥ 2 that of the (k−1)th client in ARGV[14 ..].
-- An algorithm whose state is hash fields keeps the Overall state in KEYS[1]
-- and each client's in one key, from KEYS[4] on.
local function state_keys(group)
  if algorithm.fields then
    if group == 0 then
      return { KEYS[1] }
    end
    return { KEYS[3 + group] }
  end
  local keys = {}
  for i = 1, N do
    keys[i] = KEYS[3 + group * N + i]
  end
  return keys
end

-- groups counts the groups of state keys the caller passed.
local function groups()
  if algorithm.fields then
    return #KEYS - 2
  end
  return (#KEYS - 3) / N
end

-- separate_state_keys lists the state keys that are not KEYS[1].
local function separate_state_keys()
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

-- delete_state forgets all usage: every client's, and the request log.
local function delete_state()
  if algorithm.fields then
    redis.call('HDEL', KEYS[1], unpack(algorithm.fields))
  end
  redis.call('DEL', KEYS[2], KEYS[3], unpack(separate_state_keys()))
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
  local cfg, f = read_config()
  if not cfg then return {} end
  return { tonumber(f[1]), tonumber(f[2]), tonumber(f[3] or 0), tonumber(f[4] or 0), tonumber(f[5] or 0), tonumber(f[6] or 0) }
end
if op == 'ttl' then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl ~= -2 then return ttl end
  for _, key in ipairs(separate_state_keys()) do
    ttl = math.max(ttl, redis.call('PTTL', key))
  end
  return ttl
end
if op == 'clients' then
  return call(KEYS[2], 'ZRANGE', KEYS[2], 0, -1)
end
if op == 'persist' then
  if not read_config() then
    return 0 -- state in the hash without a config expires when the limiter is full
  end
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
  return math.min(1, redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], unpack(separate_state_keys())))
end
if op == 'expire' then
  local keys = separate_state_keys()
  table.insert(keys, 1, KEYS[1])
  table.insert(keys, 2, KEYS[2])
  table.insert(keys, 3, KEYS[3])
  return cap_expiry(keys, tonumber(ARGV[3]))
end
if op == 'set' or op == 'tryset' then
  local new, _, old = config()
  if old and op == 'tryset' then
    return 0
  end
  -- Check every state key before writing anything: bad state leaves all as it was.
  for group = 0, groups() - 1 do
    for i, key in ipairs(state_keys(group)) do
      local t = redis.call('TYPE', key)['ok']
      local want = algorithm.types[i]
      if t ~= 'none' and t ~= want then
        fail('corrupt ' .. key .. ': a ' .. t .. ', not a ' .. want)
      end
    end
  end
  write_config(new)
  new.stored = true
  if old and old.type ~= new.type then
    delete_state() -- usage under one type means nothing under the other
  elseif new.type == 1 and algorithm.fields then
    redis.call('HDEL', KEYS[1], unpack(algorithm.fields)) -- Overall usage left by a default
  elseif algorithm.settle then
    for group = 0, groups() - 1 do
      algorithm.settle(new, state_keys(group))
    end
  end
  return 1
end
fail('unknown op ' .. op)
