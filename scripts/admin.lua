-- Everything but a decision: the ops that read or change a limiter as a
-- whole, and the diagnosis of a config the decision refused. Nothing here is
-- created on a decision's path.

--[[@tools]]

--[[@admin]]

-- stored_config makes a config of the hash's fields f (HMGET order): every
-- one is checked, as anything may have written them, and the first one
-- found wrong is named.
local function stored_config(f)
  local key = KEYS[1]
  local cfg = {
    rate = integer(key, 'rate', f[1], 1, RECORDS and 4294967295 or MAX), -- the token bucket's: see config.go
    interval = integer(key, 'interval', f[2], 1, MAX),
    type = integer(key, 'type', f[3], 0, 1) or 0,
    burst = integer(key, 'burst', f[4], 0, MAX) or 0,
    buckets = integer(key, 'buckets', f[5], 0, MAX_BUCKETS) or 0,
    keepalive = integer(key, 'keepAliveTime', f[6], 0, MAX) or 0,
  }
  if cfg.rate == nil or cfg.interval == nil then
    fail('corrupt ' .. key .. ': rate or interval missing')
  end
  if (cfg.buckets == 0 and DEFAULT_BUCKETS or cfg.buckets) > cfg.interval or cfg.rate > cfg.interval * 1000 then
    fail('corrupt ' .. key .. ': rate or buckets too fine for the interval')
  end
  if (f[7] or 'tokenbucket') ~= ALGORITHM then
    fail('algorithm ' .. key .. ' holds a ' .. (f[7] or 'tokenbucket') .. ' config, not ' .. ALGORITHM)
  end
  if f[8] and f[8] ~= '' then
    local _, numbers = string.gsub(f[8], '%d+', '')
    local sound = numbers % 4 == 0 and numbers <= (MAX_RATES - 1) * 4 and not string.find(f[8], '[^%d ]')
    for r, i, _, bk in string.gmatch(f[8], '(%d+) (%d+) (%d+) (%d+)') do
      r, i, bk = r + 0, i + 0, bk + 0
      sound = sound and r >= 1 and r <= i * 1000 and i <= MAX and bk <= MAX_BUCKETS and (bk == 0 and DEFAULT_BUCKETS or bk) <= i
    end
    if not sound then
      fail('corrupt ' .. key .. ': field more = ' .. string.format('%q', f[8]))
    end
    cfg.more = f[8]
  end
  if f[12] and f[12] ~= '' then
    -- Each calendar rate is one of the config's (1 its own, 2 … more's);
    -- the zone, Go checks when it reads the field back.
    local _, numbers = string.gsub(cfg.more or '', '%d+', '')
    local sound, rates = CALENDAR_RATES and string.find(f[12], '^%d=%a+:%d+:[%w_/%+%-]+'), 1 + numbers / 4
    for place in string.gmatch(f[12], '(%d+)=') do
      sound = sound and place + 0 >= 1 and place + 0 <= rates
    end
    if not sound then
      fail('corrupt ' .. key .. ': field calendar = ' .. string.format('%q', f[12]))
    end
    cfg.calendar = f[12]
  end
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
-- have: FIELDS, then each suffixed 2, 3 … (IN_CONFIG).
local RATE_FIELDS = {}
for k = 1, MAX_RATES do
  for _, field in ipairs(FIELDS) do
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
  for q, interval_q in ipairs(to) do
    for p, interval_p in ipairs(from) do
      if interval_p == interval_q or #from == 1 and #to == 1 then
        for j = 1, #FIELDS do
          local value = values[(p - 1) * #FIELDS + j]
          if value then
            local field = RATE_FIELDS[(q - 1) * #FIELDS + j]
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

-- owner names the algorithm that wrote value, a string in KEYS[1]: a
-- marker is its name, a flat state has its algorithm's shape (see FOREIGN
-- in common.lua); nil for anything else.
local function owner(value)
  if value == 'tokenbucket' or value == 'funnel' or value == 'fixed_window' or value == 'sliding_window' then
    return value
  end
  return string.find(value, '^[%d,;]+$') and 'funnel' or string.find(value, '^[%d ;]+$') and 'fixed_window'
      or string.find(value, '^[%d:,;]+$') and 'sliding_window' or nil
end

-- mismatch fails for a limiter whose state another algorithm wrote.
-- flat reads KEYS[1] when it is a string, which means no config is stored:
-- a flat state (common.lua), or '' for this algorithm's marker; nil when
-- KEYS[1] is no string. Another algorithm's fails, as does one no
-- algorithm wrote.
local function flat()
  if redis.call('TYPE', KEYS[1]).ok ~= 'string' then
    return nil
  end
  local value = redis.call('GET', KEYS[1])
  local other = owner(value)
  if not other then
    fail('corrupt ' .. KEYS[1] .. ': ' .. string.format('%q', value))
  elseif other ~= ALGORITHM then
    fail('algorithm ' .. KEYS[1] .. ' holds a ' .. other .. ' state, not ' .. ALGORITHM)
  end
  return value == ALGORITHM and '' or value
end

-- flat_fields reads a flat state as the hash fields it encodes, field and
-- value alternating, or nil when KEYS[1] holds none. Each rate's part (';'
-- between them) is empty or has one space-separated piece per field, of
-- digits (the sliding window's also ':' and ','), as the algorithm's encode
-- writes it; anything else is corrupt.
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
    local K, pieces = rates == 1 and '' or rates .. '', 0
    for piece in string.gmatch(part, '[^ ]+') do
      pieces = pieces + 1
      fields[#fields + 1], fields[#fields + 2] = (FIELDS[pieces] or '') .. K, piece
    end
    ok = ok and (pieces == 0 or pieces == #FIELDS) and rates <= MAX_RATES
  end
  if not ok then
    fail('corrupt ' .. KEYS[1] .. ': ' .. string.format('%q', value))
  end
  return fields
end

-- owned reads the limiter's hash (HMGET: the config fields, the algorithm,
-- more, then the state fields of each algorithm's Overall state), or nil
-- for a flat state or marker (see flat). Another algorithm's config or state
-- fails, as scripts/common.lua refuses it: the ops that change a limiter
-- change only their own algorithm's.
local function owned()
  if flat() then
    return nil
  end
  local f = call(KEYS[1], 'HMGET', KEYS[1], 'rate', 'interval', 'type', 'burst', 'buckets', 'keepAliveTime',
    'algorithm', 'more', 'tat', 'window', 'counts', 'calendar')
  local config = f[1] or f[2] or f[7]
  -- State fields without a config: Throttle's funnel writes them.
  local other = config and (f[7] or 'tokenbucket') or f[9] and 'funnel' or f[10] and 'fixed_window'
      or f[11] and 'sliding_window'
  if other and other ~= ALGORITHM then
    fail('algorithm ' .. KEYS[1] .. ' holds a ' .. other .. (config and ' config' or ' state') .. ', not ' .. ALGORITHM)
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
  if not f[1] and not f[2] and not f[7] then
    return nil, f
  end
  return stored_config(f), f
end

-- config: stored in Redis > the handle's default > not initialized. It
-- returns the config in force and the stored one. A 'fixed' config
-- (Throttle) ignores a stored one; a 'new' one (SetRate) is about to
-- replace it. It sets the skeleton's locals (rate, interval, …) that the
-- algorithm's helpers read.
local function config()
  local given = { string.match(ARGV[CONFIG], '^(%a+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) ?(.*)$') }
  local calendars = nil
  if given[8] and string.byte(given[8], 1) == 64 then -- '@': calendar rates (common.lua's CONFIG)
    calendars, given[8] = string.match(given[8], '^@(%S+) ?(.*)$')
  end
  local source, cfg = given[1], nil
  local old = read_config()
  if old and source ~= 'fixed' and source ~= 'new' then
    cfg = old
  elseif source then
    cfg = { rate = given[2] + 0, interval = given[3] + 0, type = given[4] + 0, burst = given[5] + 0,
      buckets = given[6] + 0, keepalive = given[7] + 0, more = given[8] ~= '' and given[8] or nil, calendar = calendars }
  else
    fail('not initialized ' .. KEYS[1])
  end
  rate, interval, kind, keepalive, stored = cfg.rate, cfg.interval, cfg.type, cfg.keepalive, old ~= nil
  burst, buckets = cfg.burst, cfg.buckets
  if burst == 0 then burst = rate end
  if buckets == 0 then buckets = DEFAULT_BUCKETS end
  return cfg, old
end

if op == 'allow' or op == 'release' or op == 'charge' or op == 'lease' or op == 'refund' then
  config() -- raises what the decision found wrong
  fail('corrupt ' .. KEYS[1] .. ': config refused')
end

-- state_keys returns a group's state keys: group 0 holds the Overall state,
-- group 1 this client's, group k ≥ 2 that of the (k−1)th client in ARGV[OTHERS ..].
-- An algorithm whose state is hash fields keeps the Overall state in KEYS[1]
-- and each client's in one key. See common.lua for the order of KEYS.
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

-- separate_state_keys lists the state keys that are not KEYS[1].
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
  for i = OTHERS, #ARGV do
    given[ARGV[i]] = true
  end
  local missing = {}
  for _, id in ipairs(call(KEYS[REGISTRY], 'ZRANGE', KEYS[REGISTRY], 0, -1)) do
    if not given[id] and id ~= ARGV[CLIENT_ID] then
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
  redis.call('HSET', KEYS[1], 'rate', cfg.rate, 'interval', cfg.interval, 'type', cfg.type,
    'keepAliveTime', cfg.keepalive)
  if ALGORITHM ~= 'tokenbucket' then
    redis.call('HSET', KEYS[1], 'algorithm', ALGORITHM)
  end
  for _, field in ipairs({ 'burst', 'buckets', 'more', 'calendar' }) do
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

if op == 'get' then
  local cfg = read_config()
  if not cfg then return {} end
  return { cfg.rate, cfg.interval, cfg.type, cfg.burst, cfg.buckets, cfg.keepalive, cfg.more or '', cfg.calendar or '' }
end
if op == 'ttl' then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl ~= -2 then return ttl end
  for _, key in ipairs(separate_state_keys()) do
    ttl = math.max(ttl, redis.call('PTTL', key))
  end
  return ttl
end
if op == 'shadow' then
  -- Shadow mode is the stored config's: on (PERMITS 1), every instance's
  -- decisions on the limiter are made and counted as ever, and their
  -- callers granted whatever the limit says; off, they are enforced again.
  if not read_config() then
    fail('not initialized ' .. KEYS[1])
  end
  if ARGV[PERMITS] == '1' then
    redis.call('HSET', KEYS[1], 'shadow', '1')
  else
    redis.call('HDEL', KEYS[1], 'shadow')
  end
  return 1
end
if op == 'clients' then
  return call(KEYS[REGISTRY], 'ZRANGE', KEYS[REGISTRY], 0, -1)
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
  owned()
  delete_state()
  return 1
end
if op == 'delete' then
  return math.min(1, redis.call('DEL', KEYS[1], KEYS[REGISTRY], KEYS[REQUESTS], unpack(separate_state_keys())))
end
if op == 'expire' then
  owned()
  local keys = separate_state_keys()
  table.insert(keys, 1, KEYS[1])
  table.insert(keys, 2, KEYS[REGISTRY])
  table.insert(keys, 3, KEYS[REQUESTS])
  return cap_expiry(keys, tonumber(ARGV[PERMITS]))
end
if op == 'set' or op == 'tryset' then
  local new, old = config()
  if old and op == 'tryset' then
    return 0
  end
  -- Check every state key before writing anything: bad state leaves all as it was.
  local fields = flat_fields()
  for group = 0, groups() - 1 do
    for i, key in ipairs(state_keys(group)) do
      local t = redis.call('TYPE', key)['ok']
      local want = TYPES[i]
      if t ~= 'none' and t ~= want and not (key == KEYS[1] and fields) then
        fail('corrupt ' .. key .. ': a ' .. t .. ', not a ' .. want)
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
  stored = true
  -- New rates forget the request log: a lease's refund names its take
  -- there, and a grant counted under other rates is never given back into
  -- these. A script re-sent across it may count twice: that only denies
  -- sooner.
  local same = old
  for _, field in ipairs({ 'rate', 'interval', 'type', 'burst', 'buckets', 'more', 'calendar' }) do
    same = same and (old[field] or 0) == (new[field] or 0)
  end
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
      if settle then
        settle(state_keys(group))
      elseif old and IN_CONFIG and (group == 0) == (new.type == 0) then
        keep_usage(state_keys(group)[1], old, new)
      end
    end
  end
  return 1
end
fail('unknown op ' .. op)
