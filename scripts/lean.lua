-- The common decision: one request of an algorithm whose state is fields
-- of the limiter's key (not the token bucket), op allow, with one rate,
-- Overall, no calendar and no request log, on a default or a stored config.
-- Every decision pays for the functions its script creates, and for each
-- step it takes: the common one creates its algorithm's module and these
-- functions, and takes no step it does not need. It decides as decide.lua
-- does, by the same module, and answers REPLY_FULL_SCRIPT for anything it
-- does not handle (a stored config with several rates, a calendar or
-- PerClient, a string another algorithm wrote, a config it refuses): the
-- decision script sends such a request on to its decide, and a client that
-- sent it alone sends it again to the decision script, as it does from then
-- on for that limiter.
-- A batch decides every common request on one key in order, in memory, as
-- they would be decided one by one, and writes the key once, when the call
-- ends or before another request reads it (flush): a hot key in a batch of
-- twenty is read once and written once, not twenty times.
-- The assembler makes two things of this file: the lean script of each
-- algorithm (the contract's header, its module as m, these functions, and
-- a call on the one request of KEYS and ARGV, framed as decide.lua's), and
-- decide.lua's common and flush, which its batches call.

--[[@lean_prelude]]
-- A batch's tables (decide.lua's; the lean script, which decides one
-- request, makes none, as every table made costs its call):
-- commons holds the configs a call's requests were given, parsed (rate,
-- interval, burst and buckets), or false for one common does not decide: a
-- batch's requests mostly share one.
-- touched holds, by key, what a batch's common requests have made of a
-- limiter's key (its entry), in order, to be written by flush. An entry
-- holds: m, the module; hash, the key holds a hash (else a flat state, or
-- nothing: existed, whether it was there); stored, the config the hash
-- holds (rate, interval, burst, buckets, keepalive, shadow); v1 and v2, the
-- state's fields as the last decision left them; dirty, they changed; px,
-- the expiry a change moved (ms); alive, a keep-alive's TTL. Its fields are
-- all named when it is made: a table that grows is rebuilt as it does.
-- scratch is, by module, the rate's table a common decision decides in
-- (decide.lua's s): one per call, as a decision leaves nothing in it that
-- the next needs (load sets everything from the state), and a table
-- reused costs a fraction of one made.
--[[@batch_tables]]

-- entry reads the limiter's key, as decide.lua's read_limiter reads it:
-- once in a batch (batched: kept in touched); default, the request's source
-- is a default whose limiter last held no hash; fixed, Throttle's. It
-- returns the entry, or a reply for a request common does not decide.
local function entry(m, key, default, fixed, batched)
  local e = batched and touched[key]
  if e then
    if e.m ~= m then return REPLY_FULL_SCRIPT end
    return e
  end
  local f, flat = nil, nil
  if default then
    local got = redis.pcall('GET', key)
    if got and got.err then
      f = m.read(key) -- a hash after all: a guess that cost a failed command, and the reply tells it
    else
      flat = got or nil
    end
  else
    f = m.read(key)
  end
  if f and f.err then return REPLY_FULL_SCRIPT end
  if f and not (f[H_RATE] or f[H_INTERVAL] or f[H_ALGORITHM] or f[m.STATE_AT] or f[m.STATE_AT + 1])
      and not fixed and redis.call('EXISTS', key) == 0 then
    f = nil -- guessed a hash, and nothing is there (after a Delete, say): the reply tells it
  end
  if flat and (string.find(flat, m.FOREIGN) or string.find(flat, ';', 1, true)) then
    return REPLY_FULL_SCRIPT -- a marker, another algorithm's, or several rates' parts
  end
  e = { m = m, hash = f ~= nil, existed = flat ~= nil, stored = false, v1 = false, v2 = false, dirty = false,
    px = false, alive = false }
  if f and (f[H_RATE] or f[H_INTERVAL] or f[H_ALGORITHM]) then
    if f[H_TYPE] == '1' then
      return REPLY_PERCLIENT -- sent with the short key list: the client sends them all, to decide.lua
    end
    local rate, interval, keepalive = tonumber(f[H_RATE]), tonumber(f[H_INTERVAL]), tonumber(f[H_KEEPALIVE] or 0)
    local own, burst, buckets = f[H_OWN], 0, 0
    if m.OWN == F_BURST then burst = tonumber(own or 0) elseif m.OWN == F_BUCKETS then buckets = tonumber(own or 0) end
    if (f[H_ALGORITHM] or UNNAMED_ALGORITHM) ~= m.NAME or (f[H_TYPE] or '0') ~= '0' or (f[H_MORE] or '') ~= ''
        or m.OWN == F_CALENDAR and (own or '') ~= ''
        or not (rate and interval and burst and buckets and keepalive and rate % 1 + interval % 1 + burst % 1 + buckets % 1 + keepalive % 1 == 0
          and rate >= 1 and interval >= 1 and interval <= MAX and rate <= interval * 1000 and burst >= 0 and burst <= MAX
          and buckets >= 0 and buckets <= MAX_BUCKETS and (buckets == 0 and DEFAULT_BUCKETS or buckets) <= interval
          and keepalive >= 0 and keepalive <= MAX) then
      return REPLY_FULL_SCRIPT
    end
    e.stored = { rate, interval, burst == 0 and rate or burst, buckets == 0 and DEFAULT_BUCKETS or buckets, keepalive,
      f[H_SHADOW] == '1' and 1 or 0 }
  elseif f and not (f[m.STATE_AT] or f[m.STATE_AT + 1]) and not fixed then
    return REPLY_FULL_SCRIPT -- a hash decide.lua must look into
  end
  if f then
    e.v1, e.v2 = f[m.STATE_AT], f[m.STATE_AT + 1]
  elseif flat and flat ~= '' and m.FIELD2 then
    e.v1, e.v2 = string.match(flat, '^(%S*) ?(.*)$')
  else
    e.v1 = flat
  end
  if batched then
    touched[key] = e
    order[#order + 1] = key
  end
  return e
end

-- write writes what the common requests left of a key, e: the state (a
-- flat state with its expiry, or fields of the hash, whose expiry moves
-- unless it holds a stored config), then a keep-alive. Numbers go to Redis
-- as strings string.format wrote: Redis writes a number it is given with
-- %.17g, a float's formatting, which costs a call more.
local function write(key, e)
  local m, v1, v2 = e.m, e.v1, e.v2
  if e.dirty and not e.hash then
    if not v1 then
      if e.existed then redis.call('DEL', key) end
    elseif e.px then
      redis.call('SET', key, v2 and v1 .. ' ' .. v2 or v1, 'PX', string.format('%d', e.px))
    else
      redis.call('SET', key, v2 and v1 .. ' ' .. v2 or v1, 'KEEPTTL')
    end
  elseif e.dirty then
    if v1 and m.FIELD2 then
      redis.call('HSET', key, m.FIELD1, v1, m.FIELD2, v2)
    elseif v1 then
      redis.call('HSET', key, m.FIELD1, v1)
    elseif m.FIELD2 then
      redis.call('HDEL', key, m.FIELD1, m.FIELD2)
    else
      redis.call('HDEL', key, m.FIELD1)
    end
    if e.px and not e.stored then
      redis.call('PEXPIRE', key, string.format('%d', e.px))
    end
  end
  if e.alive then
    redis.call('PEXPIRE', key, string.format('%d', e.alive))
  end
end

-- common decides the request whose keys are KEYS[k + 1 ..] and arguments
-- ARGV[a + 1 .. a + na], by the module m, at now (µs), and returns its
-- reply and its key's entry (batched: kept, for flush to write; else the
-- caller's to write).
local function common(m, k, a, na, now, batched)
  local key, arg = KEYS[k + 1], ARGV[a + A_CONFIG]
  -- The source, by its first byte (a match would cost a call about what a
  -- command does).
  local source = string.byte(arg, 1)
  local fixed = source == BYTE_SOURCE_FIXED
  local e = entry(m, key, source == BYTE_SOURCE_DEFAULT, fixed, batched)
  if type(e) == 'string' then
    return e
  end
  -- The config: the stored one, else the request's, of one rate.
  local rate, interval, burst, buckets, keepalive, shadow = 0, 0, 0, 0, 0, 0
  local stored = e.stored
  if stored and not fixed then
    rate, interval, burst, buckets, keepalive, shadow = stored[1], stored[2], stored[3], stored[4], stored[5], stored[6]
  elseif stored or arg == '' then
    return REPLY_FULL_SCRIPT -- Throttle's over a stored config; or none stored, and no default
  else
    -- Overall, no keep-alive, one rate (CONFIG_ARG_COMMON), or the full
    -- script's; parsed once in a batch.
    local given = nil
    if batched then given = commons[arg] end
    if given then
      rate, interval, burst, buckets = given[1], given[2], given[3], given[4]
    elseif given == false then
      return REPLY_FULL_SCRIPT
    else
      local _, _, r, i, b, bk = string.find(arg, CONFIG_ARG_COMMON)
      if not r then
        if batched then commons[arg] = false end
        return REPLY_FULL_SCRIPT
      end
      rate, interval, burst, buckets = r + 0, i + 0, b + 0, bk + 0
      if burst == 0 then burst = rate end
      if buckets == 0 then buckets = DEFAULT_BUCKETS end
      if batched then commons[arg] = { rate, interval, burst, buckets } end
    end
  end

  -- Decide, as decide.lua does for one rate, in memory.
  local s
  if batched then
    s = scratch[m]
    if not s then
      s = { K = '' }
      scratch[m] = s
    end
    s.where, s.rate, s.interval, s.burst, s.buckets = key, rate, interval, burst, buckets
  else
    s = { K = '', where = key, rate = rate, interval = interval, burst = burst, buckets = buckets }
  end
  m.load(s, e.v1 or nil, e.v2 or nil, now)
  local permits, capacity = ARGV[a + A_PERMITS] + 0, m.capacity(s)
  local allowed, retry = 0, 0
  if permits > capacity then
    retry = -1
  else
    local wait = m.wait(s, permits, now)
    if wait > 0 then retry = wait else allowed = 1 end
  end
  if allowed == 1 and permits > 0 then
    if not m.commit(s, permits, now) then
      fail(E_PERMITS .. ' ' .. string.format('%d', permits) .. ': a debt past what the state holds exactly')
    end
  end
  local remaining, reset = m.report(s, now)
  if remaining > capacity then remaining = capacity elseif remaining < 0 then remaining = 0 end
  local ms = (reset + (-reset) % 1000) / 1000
  if ms < 1 then ms = 1 end
  if allowed == 1 and permits > 0 then
    local moved
    moved, e.v1, e.v2 = m.encode(s, now)
    e.dirty = true
    if moved then e.px = ms end
  end
  if stored and keepalive > 0 and permits > 0 then
    -- Every acquire keeps the config alive, granted or denied; state in the
    -- config hash keeps it alive as long as the state counts.
    e.alive = reset > keepalive * 1000 and ms or keepalive
  end
  if not stored and not fixed and not e.hash then
    return reply_default(allowed, remaining, retry, reset, nil), e
  end
  local window = capacity * interval / rate
  window = window + (-window) % 1
  return reply_full(e.hash and REPLY_HASH or REPLY_FULL, allowed, capacity, remaining, retry, reset, window, shadow, 0, nil), e
end
--[[@lean_call]]

-- flush writes every key a batch's common requests decided on, once. It
-- comes after the lean script's call, which returns before it: a function
-- is made each time the chunk reaches it, and the lean script has no batch.
local function flush()
  for i = 1, #order do
    write(order[i], touched[order[i]])
  end
  -- Emptied in place: gopher-lua (miniredis) gives a function pcall
  -- called stale upvalues after an error, and the tables must stay one.
  for i = #order, 1, -1 do
    touched[order[i]], order[i] = nil, nil
  end
end

