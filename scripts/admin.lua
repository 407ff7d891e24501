-- The admin script: the ops that read or change a limiter as a whole, one
-- per call, for every algorithm, and the diagnosis of a config a decision
-- refused. Before this file the assembler puts the contract's header
-- (internal/wire), fail.lua and tools.lua's helpers; the algorithms' modules go
-- where the marker below says, as in decide.lua.
-- KEYS   a decision's whole key list (the limiter's key, the Overall state
--        keys unless the state is fields, the registry, the request log,
--        this client's state keys), then each other client's state keys,
--        in AD_OTHERS' order
-- ARGV   internal/wire's admin arguments: AD_ALGORITHM, AD_OP, AD_NOW,
--        AD_VALUE, AD_CONFIG, AD_CLIENT_ID, AD_OTHERS …

local MAKERS = {}
--[[@modules]]

local ALGORITHM = ARGV[AD_ALGORITHM]
local info = ALGORITHMS[ALGORITHM]
if not info then
  fail(E_CORRUPT .. ' ' .. KEYS[1] .. ': unknown algorithm ' .. string.format('%q', ALGORITHM))
end
local alg = MAKERS[ALGORITHM]()
local op = ARGV[AD_OP]
local IN_CONFIG, N, REGISTRY, REQUESTS = info.in_config, #info.state, info.registry, info.requests
local NOW_US
if ARGV[AD_NOW] == '' then
  local t = redis.call('TIME')
  NOW_US = t[1] * 1000000 + t[2]
else
  NOW_US = ARGV[AD_NOW] + 0
end
local NOW_MS = (NOW_US - NOW_US % 1000) / 1000

-- stored_config makes a config of the hash's fields f (CONFIG_FIELDS' order,
-- then the algorithm): every one is checked, as anything may have written
-- them, and the first one found wrong is named.
local function stored_config(f)
  local key = KEYS[1]
  local cfg = {
    rate = integer(key, F_RATE, f[1], 1, info.records and MAX_LOG_RATE or MAX),
    interval = integer(key, F_INTERVAL, f[2], 1, MAX),
    type = integer(key, F_TYPE, f[3], 0, 1) or 0,
    burst = integer(key, F_BURST, f[4], 0, MAX) or 0,
    buckets = integer(key, F_BUCKETS, f[5], 0, MAX_BUCKETS) or 0,
    keepalive = integer(key, F_KEEPALIVETIME, f[6], 0, MAX) or 0,
  }
  if cfg.rate == nil or cfg.interval == nil then
    corrupt(key, 'rate or interval missing')
  end
  if (cfg.buckets == 0 and DEFAULT_BUCKETS or cfg.buckets) > cfg.interval or cfg.rate > cfg.interval * 1000 then
    corrupt(key, 'rate or buckets too fine for the interval')
  end
  if (f[9] or UNNAMED_ALGORITHM) ~= ALGORITHM then
    fail(E_ALGORITHM .. ' ' .. key .. ' holds a ' .. (f[9] or UNNAMED_ALGORITHM) .. ' config, not ' .. ALGORITHM)
  end
  if f[7] and f[7] ~= '' then
    local _, numbers = string.gsub(f[7], '%d+', '')
    local sound = numbers % 4 == 0 and numbers <= (MAX_RATES - 1) * 4 and not string.find(f[7], '[^%d ]')
    for r, i, _, bk in string.gmatch(f[7], '(%d+) (%d+) (%d+) (%d+)') do
      r, i, bk = r + 0, i + 0, bk + 0
      sound = sound and r >= 1 and r <= i * 1000 and i <= MAX and bk <= MAX_BUCKETS and (bk == 0 and DEFAULT_BUCKETS or bk) <= i
    end
    if not sound then
      corrupt(key, 'field more = ' .. string.format('%q', f[7]))
    end
    cfg.more = f[7]
  end
  if f[8] and f[8] ~= '' then
    -- Each calendar rate is one of the config's (1 its own, 2 … more's);
    -- the zone, Go checks when it reads the field back.
    local _, numbers = string.gsub(cfg.more or '', '%d+', '')
    local sound, rates = info.calendar and string.find(f[8], '^%d=%a+:%d+:[%w_/%+%-]+'), 1 + numbers / 4
    for place in string.gmatch(f[8], '(%d+)=') do
      sound = sound and place + 0 >= 1 and place + 0 <= rates
    end
    if not sound then
      corrupt(key, 'field calendar = ' .. string.format('%q', f[8]))
    end
    cfg.calendar = f[8]
  end
  cfg.shadow = f[10] == '1'
  return cfg
end

-- intervals lists a config's intervals, its own rate's first.
local function intervals(cfg)
  local list = { cfg.interval }
  for _, i in string.gmatch(cfg.more or '', '(%d+) (%d+) %d+ %d+') do
    list[#list + 1] = i + 0
  end
  return list
end

-- RATE_FIELDS lists the state's hash fields for every rate a config may
-- have: its fields, then each suffixed 2, 3 … (IN_CONFIG).
local RATE_FIELDS = {}
for k = 1, MAX_RATES do
  for _, field in ipairs(info.fields) do
    RATE_FIELDS[#RATE_FIELDS + 1] = field .. RATE_SUFFIX[k]
  end
end

-- keep_usage moves the usage in hash key to the new config's rates: each
-- keeps the state of the old rate of the same interval, and the others start
-- afresh; a config of one rate changed to another of one keeps its state,
-- as it always has. New fields go in first, so that the hash never empties
-- and keeps its expiry.
local function keep_usage(key, old, new)
  local from, to = intervals(old), intervals(new)
  local values = redis.call('HMGET', key, unpack(RATE_FIELDS))
  local moved, kept = {}, {}
  local nf = #info.fields
  for q, interval_q in ipairs(to) do
    for p, interval_p in ipairs(from) do
      if interval_p == interval_q or #from == 1 and #to == 1 then
        for j = 1, nf do
          local value = values[(p - 1) * nf + j]
          if value then
            local field = RATE_FIELDS[(q - 1) * nf + j]
            moved[#moved + 1], moved[#moved + 2], kept[field] = field, value, true
          end
        end
      end
    end
  end
  if #moved > 0 then
    redis.call('HSET', key, unpack(moved))
  end
  local gone = {}
  for i, field in ipairs(RATE_FIELDS) do
    if values[i] and not kept[field] then
      gone[#gone + 1] = field
    end
  end
  if #gone > 0 then
    redis.call('HDEL', key, unpack(gone))
  end
end

-- owner names the algorithm that wrote value, a string at the limiter's
-- key: a marker is its name, a flat state has its algorithm's shape
-- (internal/wire's OwnerOf); nil for anything else.
local function owner(value)
  if ALGORITHMS[value] then
    return value
  end
  for _, shape in ipairs(FLAT_SHAPES) do
    if string.find(value, shape[2]) then
      return shape[1]
    end
  end
  return nil
end

-- flat reads the limiter's key when it is a string, which means no config
-- is stored: a flat state, or '' for this algorithm's marker; nil when the
-- key is no string. Another algorithm's fails, as does one no algorithm
-- wrote.
local function flat()
  if redis.call('TYPE', KEYS[1]).ok ~= 'string' then
    return nil
  end
  local value = redis.call('GET', KEYS[1])
  local other = owner(value)
  if not other then
    corrupt(KEYS[1], string.format('%q', value))
  elseif other ~= ALGORITHM then
    fail(E_ALGORITHM .. ' ' .. KEYS[1] .. ' holds a ' .. other .. ' state, not ' .. ALGORITHM)
  end
  return value == ALGORITHM and '' or value
end

-- flat_fields reads a flat state as the hash fields it encodes, field and
-- value alternating, or nil when the limiter's key holds none. Each rate's
-- part (';' between them) is empty or has one space-separated piece per
-- field, of digits (the sliding window's also ':' and ','), as the
-- algorithm's encode writes it; anything else is corrupt.
local function flat_fields()
  local value, fields, rates = flat(), {}, 0
  if not value then
    return nil
  elseif value == '' then
    return fields -- a marker
  end
  local ok = not string.find(value, '[^%d:, ;]')
  for part in string.gmatch(value .. ';', '([^;]*);') do
    rates = rates + 1
    local K, pieces = RATE_SUFFIX[rates] or '?', 0
    for piece in string.gmatch(part, '[^ ]+') do
      pieces = pieces + 1
      fields[#fields + 1], fields[#fields + 2] = (info.fields[pieces] or '') .. K, piece
    end
    ok = ok and (pieces == 0 or pieces == #info.fields) and rates <= MAX_RATES
  end
  if not ok then
    corrupt(KEYS[1], string.format('%q', value))
  end
  return fields
end

-- owned reads the limiter's hash (HMGET: CONFIG_FIELDS, the algorithm,
-- shadow, then every algorithm's Overall state fields: HASH_READ), or nil
-- for a flat state or marker (see flat). Another algorithm's config or
-- state fails, as a decision refuses it: the ops that change a limiter
-- change only their own algorithm's.
local HASH_READ = { unpack(CONFIG_FIELDS) }
HASH_READ[9], HASH_READ[10] = F_ALGORITHM, F_SHADOW
for i, field in ipairs(STATE_FIELD_LIST) do HASH_READ[10 + i] = field end

local function owned()
  if flat() then
    return nil
  end
  local f = call(KEYS[1], 'HMGET', KEYS[1], unpack(HASH_READ))
  local config = f[1] or f[2] or f[9]
  -- State fields without a config: Throttle's funnel writes them.
  local other = config and (f[9] or UNNAMED_ALGORITHM) or nil
  for i = 11, #HASH_READ do
    if other then break end
    if f[i] then
      for name, a in pairs(ALGORITHMS) do
        for _, mine in ipairs(a.fields) do
          if mine == HASH_READ[i] then other = name end
        end
      end
    end
  end
  if other and other ~= ALGORITHM then
    fail(E_ALGORITHM .. ' ' .. KEYS[1] .. ' holds a ' .. other .. (config and ' config' or ' state') .. ', not ' .. ALGORITHM)
  end
  return f
end

-- read_config reads the limiter's config: the stored one (nil when there is
-- none) and the fields as owned read them.
local function read_config()
  local f = owned()
  if not f then
    return nil, {}
  end
  if not f[1] and not f[2] and not f[9] then
    return nil, f
  end
  return stored_config(f), f
end

-- config: stored in Redis > the handle's default > not initialized. It
-- returns the config in force and the stored one. A fixed config (Throttle)
-- ignores a stored one; a new one (SetRate) is about to replace it.
local function config()
  local given = { string.match(ARGV[AD_CONFIG], CONFIG_ARG) }
  local calendars = nil
  if given[8] and string.byte(given[8], 1) == 64 then -- '@': calendar rates
    calendars, given[8] = string.match(given[8], '^@(%S+) ?(.*)$')
  end
  local source, cfg = given[1], nil
  local old = read_config()
  if old and source ~= SOURCE_FIXED and source ~= SOURCE_NEW then
    cfg = old
  elseif source then
    cfg = { rate = given[2] + 0, interval = given[3] + 0, type = given[4] + 0, burst = given[5] + 0,
      buckets = given[6] + 0, keepalive = given[7] + 0, more = given[8] ~= '' and given[8] or nil, calendar = calendars }
  else
    fail(E_NOT_INITIALIZED .. ' ' .. KEYS[1])
  end
  return cfg, old
end

if op == OP_DIAGNOSE then
  config() -- raises what the decision found wrong
  corrupt(KEYS[1], 'config refused')
end

-- state_keys returns a group's state keys: group 0 holds the Overall state,
-- group 1 this client's, group k ≥ 2 that of the (k−1)th client in
-- ARGV[AD_OTHERS ..]. An algorithm whose state is hash fields keeps the
-- Overall state in the limiter's key and each client's in one key.
local function state_keys(group)
  if IN_CONFIG then
    if group == 0 then
      return { KEYS[1] }
    end
    return { KEYS[REQUESTS + group] }
  end
  local keys = {}
  for i = 1, N do
    keys[i] = KEYS[group == 0 and 1 + i or REQUESTS + (group - 1) * N + i]
  end
  return keys
end

-- groups counts the groups of state keys the caller passed.
local function groups()
  if IN_CONFIG then
    return #KEYS - 2
  end
  return (#KEYS - 3) / N
end

-- separate_state_keys lists the state keys that are not the limiter's key.
local function separate_state_keys()
  local keys = {}
  for i = 2, #KEYS do
    if i ~= REGISTRY and i ~= REQUESTS then
      keys[#keys + 1] = KEYS[i]
    end
  end
  return keys
end

-- missing_clients lists registered clients whose keys the caller did not pass:
-- the ops that act on every client's keys get them from the caller, which
-- asks again with the missing ones.
local function missing_clients()
  local given = {}
  for i = AD_OTHERS, #ARGV do
    given[ARGV[i]] = true
  end
  local missing = {}
  for _, id in ipairs(call(KEYS[REGISTRY], 'ZRANGE', KEYS[REGISTRY], 0, -1)) do
    if not given[id] and id ~= ARGV[AD_CLIENT_ID] then
      missing[#missing + 1] = id
    end
  end
  return missing
end

-- delete_state forgets all usage: every client's, and the request log.
local function delete_state()
  if flat() then
    redis.call('DEL', KEYS[1])
  elseif IN_CONFIG then
    redis.call('HDEL', KEYS[1], unpack(RATE_FIELDS))
  end
  redis.call('DEL', KEYS[REGISTRY], KEYS[REQUESTS], unpack(separate_state_keys()))
end

local function write_config(cfg)
  redis.call('HSET', KEYS[1], F_RATE, cfg.rate, F_INTERVAL, cfg.interval, F_TYPE, cfg.type,
    F_KEEPALIVETIME, cfg.keepalive)
  if ALGORITHM ~= UNNAMED_ALGORITHM then
    redis.call('HSET', KEYS[1], F_ALGORITHM, ALGORITHM)
  end
  for _, field in ipairs({ F_BURST, F_BUCKETS, F_MORE, F_CALENDAR }) do
    if cfg[field] == 0 or cfg[field] == nil then
      redis.call('HDEL', KEYS[1], field)
    else
      redis.call('HSET', KEYS[1], field, cfg[field])
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

if op == OP_GET then
  local cfg = read_config()
  if not cfg then return {} end
  return { cfg.rate, cfg.interval, cfg.type, cfg.burst, cfg.buckets, cfg.keepalive, cfg.more or '', cfg.calendar or '' }
end
if op == OP_TTL then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl ~= -2 then return ttl end
  for _, key in ipairs(separate_state_keys()) do
    ttl = math.max(ttl, redis.call('PTTL', key))
  end
  return ttl
end
if op == OP_SHADOW then
  -- Shadow mode is the stored config's: on (AD_VALUE 1), every instance's
  -- decisions on the limiter are made and counted as ever, and their
  -- callers granted whatever the limit says; off, they are enforced again.
  if not read_config() then
    fail(E_NOT_INITIALIZED .. ' ' .. KEYS[1])
  end
  if ARGV[AD_VALUE] == '1' then
    redis.call('HSET', KEYS[1], F_SHADOW, '1')
  else
    redis.call('HDEL', KEYS[1], F_SHADOW)
  end
  return 1
end
if op == OP_CLIENTS then
  return call(KEYS[REGISTRY], 'ZRANGE', KEYS[REGISTRY], 0, -1)
end
if op == OP_PERSIST then
  if not read_config() then
    return 0 -- state in the hash without a config expires when the limiter is full
  end
  return redis.call('PERSIST', KEYS[1])
end

-- The ops below act on every client's keys.
local missing = missing_clients()
if #missing > 0 then
  return { REPLY_MISSING, missing }
end
if op == OP_RESET then
  owned()
  delete_state()
  return 1
end
if op == OP_DELETE then
  return math.min(1, redis.call('DEL', KEYS[1], KEYS[REGISTRY], KEYS[REQUESTS], unpack(separate_state_keys())))
end
if op == OP_EXPIRE then
  owned()
  local keys = separate_state_keys()
  table.insert(keys, 1, KEYS[1])
  table.insert(keys, 2, KEYS[REGISTRY])
  table.insert(keys, 3, KEYS[REQUESTS])
  return cap_expiry(keys, tonumber(ARGV[AD_VALUE]))
end
if op == OP_SET or op == OP_TRYSET then
  local new, old = config()
  if old and op == OP_TRYSET then
    return 0
  end
  -- Check every state key before writing anything: bad state leaves all as it was.
  local fields = flat_fields()
  for group = 0, groups() - 1 do
    for i, key in ipairs(state_keys(group)) do
      local t = redis.call('TYPE', key)['ok']
      local want = info.types[i]
      if t ~= 'none' and t ~= want and not (key == KEYS[1] and fields) then
        corrupt(key, 'a ' .. t .. ', not a ' .. want)
      end
    end
  end
  if fields then
    -- A flat state becomes the config hash's fields. SET comes first: Redis
    -- refuses a script's first write when out of memory, and never DEL.
    redis.call('SET', KEYS[1], '', 'KEEPTTL')
    redis.call('DEL', KEYS[1])
    if #fields > 0 then
      redis.call('HSET', KEYS[1], unpack(fields))
    end
  end
  write_config(new)
  -- New rates forget the request log: a reservation's release names its
  -- grant there, and a grant counted under other rates is never given back
  -- into these. A script re-sent across it may count twice: that only
  -- denies sooner.
  local same = old and old.rate == new.rate and old.interval == new.interval and old.type == new.type
    and (old.burst or 0) == (new.burst or 0) and (old.buckets or 0) == (new.buckets or 0)
    and (old.more or 0) == (new.more or 0) and (old.calendar or 0) == (new.calendar or 0)
  if not same then
    redis.call('DEL', KEYS[REQUESTS])
  end
  if old and old.type ~= new.type then
    delete_state() -- usage under one type means nothing under the other
  else
    if new.type == 1 and IN_CONFIG then
      redis.call('HDEL', KEYS[1], unpack(RATE_FIELDS)) -- Overall usage left by a default
    end
    for group = 0, groups() - 1 do
      if alg.settle then
        alg.settle(state_keys(group), new.rate, new.interval, NOW_US, new.keepalive == 0 and KEYS[1] or nil)
      elseif old and IN_CONFIG and (group == 0) == (new.type == 0) then
        keep_usage(state_keys(group)[1], old, new)
      end
    end
  end
  return 1
end
fail(E_CORRUPT .. ' ' .. KEYS[1] .. ': unknown op ' .. string.format('%q', op))
