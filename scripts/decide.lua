-- The decision script: every decision of every algorithm, one request or a
-- batch of them in one call. Before this file the assembler (internal/evalsha)
-- puts the contract's header (internal/wire: argument positions, the
-- algorithms' layout, the replies); the algorithms' modules are pasted where
-- the marker below says, each the body of a maker run when a request of its
-- algorithm first comes, so that a call builds only what it uses.
--
-- KEYS   every request's keys, one request's after another's: the
--        limiter's key (its config hash; or, with no config stored, a flat
--        state or a marker: see read_limiter), the Overall state keys (none
--        for an algorithm whose state is fields), the client registry, the
--        request log, this client's state keys. A request that needs
--        neither of the last three (not PerClient, no request log) is sent
--        without them.
-- ARGV   per request: its algorithm, op, how many keys, how many arguments,
--        then its arguments (A_NOW …, internal/wire's request arguments);
--        trailing arguments it does not use are left out.
-- Reply  a request alone in its call: its reply (internal/wire's decision
--        replies), or 'admin' for a config the decision refused (the client
--        asks the admin script why). A batch: one element per request, in
--        order, each its reply, 'admin', or {error} for one that raised an
--        error (that request's alone).
--
-- Every decision runs in three steps: read (the config, then every rate's
-- state), decide (in the rates' tables, writing nothing), write. Every check
-- that can refuse a request (a corrupt state, a clock outside a calendar's
-- windows, a debt past what a state holds exactly) is made before the first
-- write, as Redis does not roll a script back when it raises.
--
-- Every number written or returned is an integer: Lua numbers are doubles and
-- Redis truncates returned floats. A number given to redis.call is written
-- with %.17g, exact below 2^53, and string.format's %d writes it exactly for
-- less; .. writes %.14g, exact below 10^14 only.

--[[@fail]]

-- The call's clock: Redis TIME, read once, for requests that sent none.
local call_us
local function clock(arg)
  if arg ~= '' then
    return arg + 0
  end
  if not call_us then
    local t = redis.call('TIME')
    call_us = t[1] * 1000000 + t[2]
  end
  return call_us
end

--[[@state_fields]]

local MAKERS = {}
--[[@modules]]

--[[@common]]

local modules = {}
local function module(name)
  local m = modules[name]
  if not m then
    m = MAKERS[name]()
    modules[name] = m
  end
  return m
end

-- configs holds each config argument parsed, by its text: a batch's
-- requests mostly share one. A config is { source, rates, kind, keepalive,
-- spec, more }: rates, four numbers a rate (rate, interval ms, burst,
-- buckets, the defaults applied), its own first; spec, its calendar rates
-- as the hash's field keeps them; more, its further rates as the hash's
-- field keeps them.
local configs = {}

-- rates_of parses a config's rates (its own, then more's, four numbers
-- each), or returns nil for rates a config could not hold: Go checks what
-- it sends, but a stored field may hold anything. Each match starts where
-- the last one ended, so the checks cover every byte.
local function rates_of(rate, interval, burst, buckets, more)
  if not (rate and interval and rate % 1 + interval % 1 + burst % 1 + buckets % 1 == 0
        and rate >= 1 and interval >= 1 and interval <= MAX and rate <= interval * 1000
        and burst >= 0 and burst <= MAX and buckets >= 0 and buckets <= MAX_BUCKETS
        and (buckets == 0 and DEFAULT_BUCKETS or buckets) <= interval) then
    return nil
  end
  local rates = { rate, interval, burst == 0 and rate or burst, buckets == 0 and DEFAULT_BUCKETS or buckets }
  if more and more ~= '' then
    if string.byte(more, -1) == 32 then return nil end -- a trailing space
    local last = 0
    while last < #more do
      local _, r, i, b, bk
      _, last, r, i, b, bk = string.find(more, '^(%d+) (%d+) (%d+) (%d+) ?', last + 1)
      if not last or #rates == 4 * MAX_RATES then
        return nil
      end
      r, i, b, bk = r + 0, i + 0, b + 0, bk + 0
      if not (r >= 1 and r <= i * 1000 and i <= MAX and b <= MAX and bk <= MAX_BUCKETS
            and (bk == 0 and DEFAULT_BUCKETS or bk) <= i) then
        return nil
      end
      local j = #rates
      rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4] = r, i, b == 0 and r or b, bk == 0 and DEFAULT_BUCKETS or bk
    end
  end
  return rates
end

-- given parses a config the client sent (CONFIG_ARG's fields, then
-- '@' and its calendar rates, then its further rates), once per call.
local function given(arg)
  local cfg = configs[arg]
  if cfg then
    return cfg
  end
  local source, r, i, kind, b, bk, ka, rest = string.match(arg, CONFIG_ARG)
  local spec = nil
  if string.byte(rest, 1) == 64 then -- '@': calendar rates
    spec, rest = string.match(rest, '^@(%S+) ?(.*)$')
  end
  cfg = { source = source, rates = rates_of(r + 0, i + 0, b + 0, bk + 0, rest), kind = kind + 0,
    keepalive = ka + 0, spec = spec, more = rest }
  configs[arg] = cfg
  return cfg
end

-- stored reads the config the limiter's hash holds (the fields alg.read
-- reads, H_RATE … in their order), or returns nil for one this algorithm
-- cannot use (admin.lua's diagnose names the culprit).
local function stored(f, alg)
  local rate, interval, kind, keepalive = tonumber(f[H_RATE]), tonumber(f[H_INTERVAL]),
      tonumber(f[H_TYPE] or 0), tonumber(f[H_KEEPALIVE] or 0)
  if (f[H_ALGORITHM] or UNNAMED_ALGORITHM) ~= alg.NAME or not (kind and keepalive
        and kind % 1 + keepalive % 1 == 0 and (kind == 0 or kind == 1) and keepalive >= 0 and keepalive <= MAX
        and (not alg.RECORDS or rate and rate <= MAX_LOG_RATE)) then
    return nil
  end
  local burst, buckets, spec = 0, 0, nil
  local own = f[H_OWN]
  if alg.OWN == F_BURST then
    burst = tonumber(own or 0)
  elseif alg.OWN == F_BUCKETS then
    buckets = tonumber(own or 0)
  elseif alg.OWN == F_CALENDAR and own and own ~= '' then
    spec = own
  end
  if not (burst and buckets) then
    return nil
  end
  local rates = rates_of(rate, interval, burst, buckets, f[H_MORE])
  if not rates then
    return nil
  end
  return { rates = rates, kind = kind, keepalive = keepalive, spec = spec, more = f[H_MORE],
    shadow = f[H_SHADOW] == '1' and 1 or 0 }
end

-- read_limiter reads the limiter's key. It is a hash (a stored config, or
-- state fields: Throttle's, or a default's written before the config) or,
-- for an algorithm whose Overall state is fields (IN_CONFIG), while no
-- config is stored, a flat state: the Overall state as a string (each
-- rate's fields space-separated, ';' between rates), which GET reads and
-- SET … PX writes at less cost than HMGET, HSET and PEXPIRE; or, while no
-- config is stored and the state is elsewhere (the token bucket's, any
-- PerClient state), a marker: the algorithm's name, expiring with that
-- state. The read the client expects is tried first (a default whose last
-- decision met no hash reads a string, any other request a hash), and a
-- wrong guess costs a failed command: the reply's kind tells the client
-- what was found, so that its next guess is right.
-- It returns f, the hash's fields (alg.read's: the config's, then the first
-- rate's state fields), or nil; flat, a string, or nil. got: the GET's
-- reply, when bucket_common made it already.
local function read_limiter(key, alg, hash_first, got)
  if not hash_first then
    got = got or redis.pcall('GET', key)
    if not got then
      return nil, nil
    elseif not got.err then
      return nil, got
    end
  end
  local f = alg.read(key)
  if not f.err then
    return f, nil
  elseif redis.call('TYPE', key).ok == 'string' then
    return nil, redis.call('GET', key)
  end
  corrupt(key, f.err)
end

-- arg is a request's argument i, or nil when it was not sent: the
-- request's arguments are ARGV[a + 1 .. a + na].
local function arg(a, na, i)
  if i <= na then
    return ARGV[a + i]
  end
  return nil
end

-- suffix is the suffix of rate i's state fields (K): '' for the config's
-- own, '2', '3' … for its further ones.
local function suffix(i)
  if i == 1 then return '' end
  return string.format('%d', i)
end

-- step is the module deciding rate i: a further rate's own when the
-- algorithm has one (the token bucket's).
local function step(alg, i)
  if i > 1 and alg.FURTHER then return alg.FURTHER end
  return alg
end

-- request_log: with WithRetryWindow, the log remembers each request id for
-- its window (LOG_WINDOW, ms), so that a script go-redis re-sends after a
-- read timeout counts once; a reservation's id stays there while it may be
-- released, and its release removes it.
local function logged(key, id)
  local seen = redis.pcall('ZSCORE', key, id)
  if type(seen) == 'table' and seen.err then
    corrupt(key, seen.err)
  end
  return seen ~= false and seen ~= nil
end

local function log_request(key, id, now_ms, window)
  redis.call('ZADD', key, 'NX', string.format('%d', now_ms + window), id)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now_ms))
  -- Never sooner than an entry logged for longer (a reservation's).
  if redis.call('PTTL', key) < window + 0 then
    redis.call('PEXPIRE', key, window)
  end
end

-- entry is the score of id's entry in the request log (when it expires,
-- ms), or nil when there is none or it has expired on the request's clock
-- (the log drops expired entries only as later requests come).
local function entry(key, id, now_ms)
  local score = redis.pcall('ZSCORE', key, id)
  if type(score) == 'table' and score.err then
    corrupt(key, score.err)
  end
  score = tonumber(score or '')
  if score and score > now_ms then
    return score
  end
  return nil
end

-- weigh decides n permits on every rate of list: a request is granted only
-- if every rate allows it; a denial is bound by the longest wait, or by the
-- first rate that can never grant so many. It returns allowed (0 or 1),
-- retry (µs, -1: never) and bound (the binding rate, 0 for the first).
local function weigh(alg, list, n, charge, now)
  local most, bound = nil, 0
  for i, s in ipairs(list) do
    local m = step(alg, i)
    if n > m.capacity(s) and not charge then
      return 0, -1, i - 1
    end
    -- (A peek too: a limiter over a rate lowered since says so.)
    local wait = charge and 0 or m.wait(s, n, now)
    if not most or wait > most then
      most = wait
      if wait > 0 then bound = i - 1 end
    end
  end
  if most > 0 then
    return 0, most, bound
  end
  return 1, 0, bound
end

-- The decision of one request (its algorithm name, op; its keys are
-- KEYS[k + 1 ..], its arguments ARGV[a + 1 .. a + na]), or nil for a config
-- it refuses. (Given as arguments, not upvalues: gopher-lua, miniredis's
-- Lua, gives a function called by pcall stale upvalues after an error.)
-- got: the limiter's key as bucket_common read it (a default's GET), or nil.
local function decide(name, op, k, a, na, got)
  local alg = module(name)
  local now = clock(ARGV[a + A_NOW])
  local now_ms = (now - now % 1000) / 1000
  local config_arg = ARGV[a + A_CONFIG]
  local source = string.match(config_arg, '^%a+') or ''
  local has_clients = na >= A_CLIENT_ID -- sent the whole key list
  local key1 = KEYS[k + 1]
  local in_config = alg.IN_CONFIG

  -- Read: the config, stored (and sound) or given.
  local f, flat = read_limiter(key1, alg, source ~= SOURCE_DEFAULT, got)
  local none, marked = not f and not flat, false
  if flat and string.find(flat, alg.FOREIGN) then
    -- One algorithm's state is never counted by another: a string another
    -- wrote goes to admin.lua, which names it. This algorithm's marker says
    -- only that its state is elsewhere: none here.
    if flat ~= name then
      return nil
    end
    flat, none, marked = nil, true, true
  end
  local cfg, hash, shadow = nil, f ~= nil, 0
  if f and (f[H_RATE] or f[H_INTERVAL] or f[H_ALGORITHM]) then
    cfg = stored(f, alg)
    if not cfg then
      return nil
    end
    shadow = cfg.shadow
  end
  local is_stored = cfg ~= nil
  if config_arg ~= '' and (not cfg or source == SOURCE_FIXED) then
    cfg = given(config_arg)
    if not cfg.rates then
      return nil
    end
  end
  if not cfg then
    return nil -- not initialized: admin.lua says so
  end
  if f and not is_stored and cfg.source ~= SOURCE_FIXED and not (in_config and (f[alg.STATE_AT] or f[alg.STATE_AT + 1])) then
    -- A default that found a hash with neither config nor state of its own
    -- (its first rate's): if the key is not there at all, nothing is (the
    -- state is written flat, or the marker); a hash of another algorithm's
    -- state fields (as Throttle leaves a funnel's) goes to admin.lua. Not on
    -- the usual paths.
    if redis.call('EXISTS', key1) == 0 then
      f, none, hash = nil, true, false
    else
      local g = redis.call('HMGET', key1, STATE_FIELDS())
      for i = 1, #g do
        if g[i] then return nil end
      end
    end
  end
  local kind, rates = cfg.kind, cfg.rates
  local n = #rates / 4
  if alg.rare and (n > 1 or op == OP_RELEASE or op == OP_SETTLE) then
    alg.rare() -- the module's functions beyond the common decision (see the assembler)
  end
  if kind == 1 and not has_clients then
    return REPLY_PERCLIENT -- sent with the short key list: the client sends them all from now on
  end
  -- Calendar rates count in windows whose edges Go sent (CALENDAR); a
  -- request that sent none, or another config's, is told which to send.
  local calendar = nil
  if cfg.spec then
    if not alg.CALENDAR then
      return nil
    end
    local sent, edges = string.match(arg(a, na, A_CALENDAR) or '', '^(%S+) (.*)$')
    if sent ~= cfg.spec then
      return REPLY_CALENDAR .. cfg.spec
    end
    local list, at = {}, 0
    for edge in string.gmatch(edges, '%d+') do list[#list + 1] = edge + 0 end
    calendar = {}
    for place in string.gmatch(cfg.spec, '(%d+)=') do
      if place + 0 > n then
        return nil -- a rate the config does not have (admin.lua names it)
      end
      calendar[place + 0] = { list[at + 1], list[at + 2], list[at + 3], list[at + 4] }
      at = at + 4
    end
  end

  -- Read: every rate's state. Where it is: the Overall state of an
  -- IN_CONFIG algorithm in the limiter's key (fields of its hash, or the
  -- flat state), a client's in a hash of its own; the token bucket's in
  -- keys of its own. Each rate's table s holds its config (rate, interval
  -- in ms, burst, buckets; K, the suffix of its state fields; edges, a
  -- calendar rate's windows; where, the key holding it) and what its
  -- algorithm's functions put there.
  local where, keys = key1, nil
  if kind == 1 then
    local first = k + alg.REQUESTS + 1
    if in_config then
      where = KEYS[first]
    else
      keys = { KEYS[first], KEYS[first + 1], KEYS[first + 2] }
    end
  elseif not in_config then
    keys = { KEYS[k + 2], KEYS[k + 3], KEYS[k + 4] }
  end
  local longest = 0
  for j = 5, #rates, 4 do
    if rates[j + 1] > longest then longest = rates[j + 1] end
  end
  local list = {}
  for i = 1, n do
    local j = 4 * i - 4
    list[i] = { rate = rates[j + 1], interval = rates[j + 2], burst = rates[j + 3], buckets = rates[j + 4], K = suffix(i),
      edges = calendar and calendar[i], where = where, keys = keys, longest = longest }
  end
  local flat_write = in_config and not f and kind == 0
  local rest = nil -- a flat state's parts beyond this config's rates, kept
  if in_config then
    local field1, field2 = alg.FIELD1, alg.FIELD2
    if n == 1 and where == key1 then
      -- The common case: one rate, its fields read with the config's, or
      -- its flat state (a part, and maybe another handle's further ones).
      local v1, v2 = nil, nil
      if f then
        v1, v2 = f[alg.STATE_AT], f[alg.STATE_AT + 1]
      elseif flat then
        local cut = string.find(flat, ';', 1, true)
        local part = flat
        if cut then
          part, rest = string.sub(flat, 1, cut - 1), string.sub(flat, cut + 1)
        end
        if part ~= '' then
          if field2 then v1, v2 = string.match(part, '^(%S*) ?(.*)$') else v1 = part end
        end
      end
      alg.load(list[1], v1, v2, now)
    else
      local values, nf = {}, field2 and 2 or 1
      if where ~= key1 or f then
        local names = {}
        for i = 1, n do
          names[#names + 1] = field1 .. list[i].K
          if field2 then names[#names + 1] = field2 .. list[i].K end
        end
        local g = redis.pcall('HMGET', where, unpack(names))
        if g.err then corrupt(where, g.err) end
        values = g
      elseif flat then
        local i, from = 0, 1
        while from <= #flat + 1 do
          local cut = string.find(flat, ';', from, true) or #flat + 1
          i = i + 1
          if i > n then
            rest = string.sub(flat, from)
            break
          end
          local part = string.sub(flat, from, cut - 1)
          if part ~= '' then
            if field2 then
              values[2 * i - 1], values[2 * i] = string.match(part, '^(%S*) ?(.*)$')
            else
              values[i] = part
            end
          end
          from = cut + 1
        end
      end
      for i, s in ipairs(list) do
        alg.load(s, values[(i - 1) * nf + 1], field2 and values[(i - 1) * nf + 2] or nil, now)
      end
    end
  else
    for i, s in ipairs(list) do
      step(alg, i).load(s, nil, nil, now)
    end
  end

  -- Decide, in the rates' tables.
  local id, log_window = arg(a, na, A_ID), arg(a, na, A_LOG_WINDOW)
  local LOG = log_window ~= nil and log_window ~= ''
  local requests = has_clients and KEYS[k + alg.REQUESTS] or nil
  local charge, permits, least = op == OP_CHARGE, tonumber(ARGV[a + A_PERMITS]), nil
  if op == OP_RESERVE then
    least = tonumber(arg(a, na, A_LEAST))
  end
  local allowed, retry, bound, back, counted, resent, wrote = 0, 0, 0, 0, false, false, false
  local settled = nil -- a settle's entry in the request log, its score
  if op == OP_RELEASE then
    -- A reservation's release names its id, which the reservation left in
    -- the request log: it gives back once, and nothing once the entry has
    -- expired or after whatever forgot the log (Reset, Delete, new rates:
    -- the state its grant was counted in is gone, or counts otherwise).
    if requests and entry(requests, id, now_ms) then
      local at, size, given_back = tonumber(arg(a, na, A_GRANT_AT)), tonumber(arg(a, na, A_GRANT_SIZE)), nil
      for i, s in ipairs(list) do
        local b = step(alg, i).release(s, permits, at, size, now)
        if not given_back or b < given_back then given_back = b end
      end
      back, wrote = given_back or 0, true
    end
  elseif op == OP_SETTLE then
    -- A reservation's cost past what it holds (internal/wire's OpSettle):
    -- counted once, while its entry lasts, as far as every rate's room
    -- (its cap) allows.
    settled = requests and entry(requests, id, now_ms)
    if not settled and requests and logged(requests, arg(a, na, A_NEXT)) then
      back = SETTLED_BEFORE -- sent again: its first run moved the entry on
    elseif settled then
      local at, size = tonumber(arg(a, na, A_GRANT_AT)), tonumber(arg(a, na, A_GRANT_SIZE))
      local cap, n = tonumber(arg(a, na, A_MAX_DEBT) or ''), permits
      for i, s in ipairs(list) do
        local room = step(alg, i).room(s, cap, now)
        if room and room < n then n = room end
      end
      if n > 0 then
        for i, s in ipairs(list) do
          local ok, why = step(alg, i).extend(s, n, at, size, now, arg(a, na, A_NEXT))
          if not ok then
            fail(E_PERMITS .. ' ' .. string.format('%d', n) .. ': ' .. (why or 'a debt past what the state holds exactly'))
          end
        end
        back, wrote = n, true
      end
    end
  else
    allowed, retry, bound = weigh(alg, list, permits, charge, now)
    if allowed == 0 and least and least < permits then
      -- A reservation that does not fit whole (now, or ever: more than a
      -- rate's capacity) takes as many as fit now, if that is least or
      -- more: the rates' least remaining.
      local fit = nil
      for i, s in ipairs(list) do
        local m = step(alg, i)
        local r = math.max(0, math.min(m.report(s, now), m.capacity(s)))
        if not fit or r < fit then fit = r end
      end
      if fit >= least then
        permits = fit
        allowed, retry, bound = weigh(alg, list, permits, charge, now)
      end
    end
    if allowed == 1 and permits > 0 and op ~= OP_CHECK then -- a check counts nothing
      if LOG and logged(requests, id) then
        resent = true -- a re-sent script whose first run was granted: counted already
      else
        for i, s in ipairs(list) do
          local ok, why = step(alg, i).commit(s, permits, now, id)
          if not ok then
            fail(E_PERMITS .. ' ' .. string.format('%d', permits) .. ': ' .. (why or 'a debt past what the state holds exactly'))
          end
        end
        counted = true
      end
    elseif allowed == 0 and retry ~= -1 and permits > 0
        and (alg.RECORDS and alg.resent(list[1], id) or LOG and logged(requests, id)) then
      allowed, retry, resent = 1, 0, true -- a re-sent script whose first run was granted
    end
  end

  -- Write.
  local config_key = is_stored and cfg.keepalive == 0 and key1 or nil
  -- life: how long a grant counts at most (ms), its rates' longest
  -- interval, or the time a funnel takes to drain when its burst exceeds
  -- its rate.
  local life = 0
  for j = 1, #rates, 4 do
    life = math.max(life, rates[j + 1], rates[j + 2] * rates[j + 1] / rates[j])
  end
  life = life + (-life) % 1
  if kind == 1 and (counted or list[1].grant and not list[1].resent or settled and wrote) then
    -- The registry lets Delete, Reset and Expire reach every client's keys.
    -- It lives as long as any client's state can. It is written first, as
    -- the one key a grant writes that no read has checked: of another type,
    -- it refuses the request with nothing written.
    local registry = KEYS[k + alg.REGISTRY]
    local added = redis.pcall('ZADD', registry, now_ms, arg(a, na, A_CLIENT_ID))
    if type(added) == 'table' then
      corrupt(registry, added.err)
    end
    local life_ms = life
    local cap = config_key and redis.call('PTTL', config_key)
    if cap and cap > 0 and cap < life_ms then life_ms = cap end
    redis.call('PEXPIRE', registry, string.format('%d', life_ms))
    -- PerClient state is in keys of each algorithm's own (and the registry,
    -- which all share): on a default, a marker in the limiter's key as the
    -- token bucket's, for as long as the registry lives.
    if none then
      redis.call('SET', key1, name, 'PX', string.format('%d', life_ms))
    end
  end
  local adjusts = op == OP_RELEASE or op == OP_SETTLE -- a reservation's release or settle
  if not in_config and (wrote or not adjusts and op ~= OP_CHECK and permits > 0) then
    -- The token bucket writes its own state: a grant, a release, or a cache
    -- a request for permits found wrong (a peek writes nothing).
    counted = alg.write(list[1], now, config_key) and counted
    for i = 2, n do
      if counted or wrote then alg.FURTHER.write(list[i], now, config_key) end
    end
  end
  if LOG and counted then
    -- A reservation's id stays while its grant may be released.
    -- (Or for its time to settle, when it has one.)
    local window = log_window
    if op == OP_RESERVE then
      window = tonumber(arg(a, na, A_TIMEOUT) or '') or math.max(log_window + 0, life)
    end
    log_request(requests, id, now_ms, window)
  elseif settled then
    -- A settle's entry moves on, keeping its expiry (a closed
    -- reservation's lasts as an unsettled one's would).
    redis.call('ZREM', requests, id)
    redis.call('ZADD', requests, string.format('%d', settled), arg(a, na, A_NEXT))
  elseif wrote then
    redis.call('ZREM', requests, id)
  end
  local remaining, reset, resets = nil, 0, n > 1 and {} or nil
  for i, s in ipairs(list) do
    local m = step(alg, i)
    local r, t = m.report(s, now)
    if resets then resets[i] = string.format('%d', t) end
    local limit = m.capacity(s)
    if r > limit then r = limit elseif r < 0 then r = 0 end
    if not remaining or r < remaining then
      remaining = r
      if allowed == 1 and i > 1 then bound = i - 1 end
    end
    if t > reset then reset = t end
  end
  local ms = (reset + (-reset) % 1000) / 1000
  if ms < 1 then ms = 1 end
  if in_config and (counted or wrote) then
    -- The state's fields, written where they are: a flat state with its
    -- expiry, once; fields of a hash, with the hash's expiry moved when a
    -- rate's moved (a stored config's own key keeps the config's expiry).
    local field1, field2 = alg.FIELD1, alg.FIELD2
    local moved, value, fields, gone = false, nil, nil, nil
    if n == 1 then
      local v1, v2
      moved, v1, v2 = alg.encode(list[1], now)
      if flat_write then
        if v1 then value = v2 and v1 .. ' ' .. v2 or v1 end
        if rest and (value or string.find(rest, '[^;]')) then
          value = (value or '') .. ';' .. rest -- another handle's further rates, kept
        end
      elseif v1 then
        fields = { field1, v1, field2, v2 }
      else
        gone = { field1, field2 }
      end
    else
      local parts, empty = {}, true
      fields, gone = {}, {}
      for i, s in ipairs(list) do
        local m, v1, v2 = alg.encode(s, now)
        moved = moved or m
        if v1 then
          empty = false
          parts[i] = v2 and v1 .. ' ' .. v2 or v1
          fields[#fields + 1], fields[#fields + 2] = field1 .. s.K, v1
          if field2 then fields[#fields + 1], fields[#fields + 2] = field2 .. s.K, v2 end
        else
          parts[i] = ''
          gone[#gone + 1] = field1 .. s.K
          if field2 then gone[#gone + 1] = field2 .. s.K end
        end
      end
      if rest then
        parts[#parts + 1] = rest
        empty = empty and not string.find(rest, '[^;]')
      end
      if not empty then value = table.concat(parts, ';') end
    end
    if flat_write then
      if not value then
        if flat then redis.call('DEL', key1) end
      elseif moved then
        redis.call('SET', key1, value, 'PX', string.format('%d', ms))
      else
        redis.call('SET', key1, value, 'KEEPTTL')
      end
    else
      if fields and #fields > 0 then redis.call('HSET', where, unpack(fields)) end
      if gone and #gone > 0 then redis.call('HDEL', where, unpack(gone)) end
      if (moved or n > 1) and (where ~= key1 or not is_stored) then
        local cap = config_key and redis.call('PTTL', config_key)
        if cap and cap > 0 and cap < ms then ms = cap end
        redis.call('PEXPIRE', where, string.format('%d', ms))
      end
    end
  end
  -- The token bucket on a default keeps its state in keys the others never
  -- read: its marker in the limiter's key shows them it is there, with the
  -- read they make anyway, and expires with the state. It is written when
  -- the state was (a grant: one command) or found missing (state from
  -- before markers), and goes when the state does.
  if none and not in_config and kind == 0 and (counted or wrote or not marked and op ~= OP_CHECK) then
    if reset > 0 then
      redis.call('SET', key1, name, 'PX', string.format('%d', ms))
    elseif marked then
      redis.call('DEL', key1)
    end
  end
  if is_stored and cfg.keepalive > 0 and permits > 0 and op ~= OP_CHECK and (not adjusts or settled and wrote) then
    -- Every acquire keeps the config alive, granted or denied: a saturated
    -- limiter is busy, not idle. State in the config hash keeps it alive as
    -- long as the state counts (a funnel whose burst drains slower).
    local ttl = cfg.keepalive
    if in_config and kind == 0 and reset > ttl * 1000 then
      ttl = ms
    end
    redis.call('PEXPIRE', key1, string.format('%d', ttl))
  end

  -- Reply.
  if adjusts then
    return back
  end
  if resent then allowed, retry = 1, 0 end
  local tail = ''
  if op == OP_RESERVE then
    -- The grant's time (a funnel's, when it starts to drain: the earliest
    -- of its rates'), and the first of the windows it counts in to end.
    local since, ends = nil, nil
    for _, s in ipairs(list) do
      if s.since and (not since or s.since < since) then since = s.since end
      if s.ends and (not ends or s.ends < ends) then ends = s.ends end
    end
    local taken = (allowed == 1 and not resent) and permits or (resent and least or 0)
    tail = string.format(RESERVE_TAIL, since or now, taken, ends and ends - now or 0)
  end
  if not is_stored and source ~= SOURCE_FIXED and not hash and not calendar then
    -- A default decided and no hash holds the state: the client knows every
    -- limit and window, and the short reply leaves them out.
    if resets then
      return reply_default(allowed, remaining, retry, reset, bound) .. ' ' .. table.concat(resets, ' ') .. tail
    end
    return reply_default(allowed, remaining, retry, reset, nil) .. tail
  end
  -- The span the first rate's limit applies to: its interval (a calendar
  -- window's own length), or the time a funnel's burst takes to drain. With
  -- several rates, each rate's reset follows the bound, then the further
  -- rates as the hash's field more keeps them (the client works out their
  -- limits and windows), or, for calendar windows, as they are now.
  local first = list[1]
  local limit = alg.capacity(first)
  local window = limit * (first.length or first.interval) / first.rate
  window = window + (-window) % 1
  local more = nil
  if n > 1 then
    more = cfg.more
    if calendar then
      local now_rates = {}
      for i = 2, n do
        local s = list[i]
        now_rates[#now_rates + 1] = string.format('%d %d %d %d', s.rate, s.length or s.interval, s.burst, s.buckets)
      end
      more = table.concat(now_rates, ' ')
    end
    more = table.concat(resets, ' ') .. ' ' .. more
  end
  return reply_full(hash and REPLY_HASH or REPLY_FULL, allowed, limit, remaining, retry, reset, window,
    shadow, bound, more) .. tail
end

-- bucket_common decides the token bucket's common request (alg's): op
-- allow, one rate, Overall, no keep-alive, no calendar and no request log,
-- on a default whose limiter's key holds nothing or the bucket's marker.
-- It decides as decide does for it, by the same steps and commands, without
-- decide's general ones (its tables of rates and loops over them, the
-- request log, the client registry), the better part of a lone decision's
-- cost. Anything else it leaves to decide (nil) before any command but
-- the clock's and the limiter's read (a default's GET), whose reply it
-- returns too, for decide to take.
local function bucket_common(alg, k, a, na)
  local config_arg = ARGV[a + A_CONFIG]
  if na > A_ID or string.byte(config_arg, 1) ~= BYTE_SOURCE_DEFAULT then
    return nil
  end
  local _, _, rate, interval, burst, buckets = string.find(config_arg, CONFIG_ARG_COMMON)
  if not rate then
    return nil
  end
  rate, interval, burst, buckets = rate + 0, interval + 0, burst + 0, buckets + 0
  if not (rate >= 1 and interval >= 1 and interval <= MAX and rate <= interval * 1000 and burst <= MAX
        and buckets <= MAX_BUCKETS and (buckets == 0 and DEFAULT_BUCKETS or buckets) <= interval) then
    return nil -- rates_of refuses it: decide says so
  end
  if burst == 0 then burst = rate end
  if buckets == 0 then buckets = DEFAULT_BUCKETS end

  -- Read, as decide does: the clock, then the limiter's key.
  local key = KEYS[k + 1]
  local now = clock(ARGV[a + A_NOW])
  local got = redis.pcall('GET', key)
  local marked = false
  if got then
    if got.err or got ~= alg.NAME then
      return nil, got
    end
    marked = true
  end
  local s = { rate = rate, interval = interval, burst = burst, buckets = buckets, K = '', where = key,
    keys = { KEYS[k + 2], KEYS[k + 3], KEYS[k + 4] }, longest = 0 }
  alg.load(s, nil, nil, now)

  -- Decide: weigh, for one rate.
  local permits, id = ARGV[a + A_PERMITS] + 0, nil
  if na >= A_ID then id = ARGV[a + A_ID] end
  local allowed, retry, counted = 0, 0, false
  if permits > rate then
    retry = -1
  else
    local wait = alg.wait(s, permits, now)
    if wait > 0 then retry = wait else allowed = 1 end
  end
  if allowed == 1 and permits > 0 then
    local ok, why = alg.commit(s, permits, now, id)
    if not ok then
      fail(E_PERMITS .. ' ' .. string.format('%d', permits) .. ': ' .. (why or 'a debt past what the state holds exactly'))
    end
    counted = true
  elseif allowed == 0 and retry ~= -1 and permits > 0 and alg.resent(s, id) then
    allowed, retry = 1, 0 -- a re-sent script whose first run was granted
  end

  -- Write: the state, then its marker (see decide), expiring with it.
  if permits > 0 then
    counted = alg.write(s, now, nil) and counted
  end
  local remaining, reset = alg.report(s, now)
  if remaining > rate then remaining = rate elseif remaining < 0 then remaining = 0 end
  if counted or not marked then
    if reset > 0 then
      local ms = (reset + (-reset) % 1000) / 1000
      if ms < 1 then ms = 1 end
      redis.call('SET', key, alg.NAME, 'PX', string.format('%d', ms))
    elseif marked then
      redis.call('DEL', key)
    end
  end
  return reply_default(allowed, remaining, retry, reset, nil)
end

-- request decides one request: the common decision's way (lean.lua's
-- common, or bucket_common) when it is one, else decide's, which reads
-- what the common requests before it wrote (flush).
local function request(name, op, k, a, na)
  local got = nil
  if op == OP_ALLOW and na <= A_ID then
    local m = module(name)
    if m.IN_CONFIG and na <= A_CONFIG then
      local now = ARGV[a + A_NOW]
      local reply = common(m, k, a, na, now == '' and clock(now) or now + 0, true)
      if reply ~= REPLY_FULL_SCRIPT then
        return reply
      end
    elseif m.RECORDS then
      flush()
      local reply
      reply, got = bucket_common(m, k, a, na)
      if reply then
        return reply
      end
    end
  end
  flush()
  return decide(name, op, k, a, na, got)
end

-- All-or-nothing (internal/wire's FrameAll): every request decided first
-- as a check (OP_CHECK: decide's allow, counting and writing nothing),
-- then, only if every binding one was granted, as an allow, which grants
-- each as its check did: the requests' keys are distinct, and the state
-- each reads is the one its check read. A request binds unless its flag
-- says shadow mode or its stored config is in it (the reply's field
-- POS_SHADOW). An error raised by a check is the call's, nothing written.
if ARGV[1] == FRAME_ALL then
  local flags, reqs, replies, ki, ai = ARGV[2], {}, { 1 }, 0, 2
  while ai < #ARGV do
    local i, name, nk, na = #reqs + 1, ARGV[ai + 1], ARGV[ai + 3] + 0, ARGV[ai + 4] + 0
    local reply = decide(name, OP_CHECK, ki, ai + REQUEST_HEAD, na) or REPLY_ADMIN
    local kind, allowed, fields = string.match(reply, '^(%a) ([01]) (.*)$')
    if not kind then
      replies[1] = 0 -- not a decision: the client learns from it, and asks again
    elseif allowed == '0' and string.byte(flags, i) ~= BYTE_ALL_SHADOW then
      local at, shadow = 0, false
      for field in string.gmatch(fields, '%S+') do
        at = at + 1
        if at == POS_SHADOW then
          shadow = kind ~= REPLY_DEFAULT and field == '1'
          break
        end
      end
      if not shadow then replies[1] = 0 end
    end
    reqs[i], replies[i + 1] = { name, ki, ai + REQUEST_HEAD, na }, reply
    ki, ai = ki + nk, ai + REQUEST_HEAD + na
  end
  if replies[1] == 1 then
    for i, r in ipairs(reqs) do
      replies[i + 1] = decide(r[1], OP_ALLOW, r[2], r[3], r[4]) or REPLY_ADMIN
    end
  end
  return replies
end

-- A request alone in its call is answered with its reply, and raises its
-- errors as the call's, where Redis names the script's line (and so the
-- command an ACL refused).
if REQUEST_HEAD + ARGV[REQUEST_HEAD] == #ARGV then
  local reply = request(ARGV[1], ARGV[2], 0, REQUEST_HEAD, #ARGV - REQUEST_HEAD)
  flush()
  return reply or REPLY_ADMIN
end

-- A batch's requests, one after another, each on its own keys and
-- arguments; each request's error is its own reply.
local replies, ki, ai = {}, 0, 0
while ai < #ARGV do
  local name, op, nk, nargs = ARGV[ai + 1], ARGV[ai + 2], ARGV[ai + 3] + 0, ARGV[ai + 4] + 0
  local ok, reply = pcall(request, name, op, ki, ai + REQUEST_HEAD, nargs)
  if not ok then
    -- Redis raises its errors as tables, the scripts theirs as strings.
    if type(reply) == 'table' then reply = reply.err end
    reply = { type(reply) == 'string' and reply or 'error' }
  elseif reply == nil then
    reply = REPLY_ADMIN
  end
  replies[#replies + 1] = reply
  ki, ai = ki + nk, ai + REQUEST_HEAD + nargs
end
flush()
return replies
