-- The common decision alone: one request of an algorithm whose state is
-- fields of the limiter's key (not the token bucket), op allow, with one
-- rate, Overall, no calendar and no request log, on a default or a stored
-- config. A lone call pays for every function the script creates, so this
-- one creates its algorithm's module and little else; it decides as
-- decide.lua does, by the same module, and answers REPLY_FULL_SCRIPT for
-- anything it does not handle (a stored config with several rates, a
-- calendar or PerClient, a string another algorithm wrote, a config it
-- refuses), which the client sends again to decide.lua, as it does from
-- then on for that limiter. Before this file the assembler puts the
-- contract's header and the one module (m).
-- KEYS and ARGV are decide.lua's for one request: KEYS[1] the limiter's
-- key; ARGV the request's head (algorithm, op, keys, arguments) and its
-- arguments, up to A_CONFIG.

local MAX = 9007199254740992 -- 2^53

local function fail(why)
  error('REDLIMIT ' .. why, 0)
end

local function corrupt(key, what)
  fail(E_CORRUPT .. ' ' .. key .. ': ' .. what)
end

--[[@module]]

local a = REQUEST_HEAD
local now = ARGV[a + A_NOW]
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = now + 0
end
local key, arg = KEYS[1], ARGV[a + A_CONFIG]
local source = string.match(arg, '^%a+') or ''

-- The limiter's key, read as decide.lua's read_limiter reads it; the
-- config, stored or given, of one rate.
local f, flat = nil, nil
if source == SOURCE_DEFAULT then
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
    and source ~= SOURCE_FIXED and redis.call('EXISTS', key) == 0 then
  f = nil -- guessed a hash, and nothing is there (after a Delete, say): the reply tells it
end
if flat and (string.find(flat, m.FOREIGN) or string.find(flat, ';', 1, true)) then
  return REPLY_FULL_SCRIPT -- a marker, another algorithm's, or several rates' parts
end
local rate, interval, burst, buckets, keepalive, stored, shadow = nil, nil, 0, 0, 0, false, 0
if f and (f[H_RATE] or f[H_INTERVAL] or f[H_ALGORITHM]) then
  rate, interval = tonumber(f[H_RATE]), tonumber(f[H_INTERVAL])
  keepalive = tonumber(f[H_KEEPALIVE] or 0)
  if f[H_TYPE] == '1' then
    return REPLY_PERCLIENT -- sent with the short key list: the client sends them all, to decide.lua
  end
  local own = f[H_OWN]
  if m.OWN == 'burst' then burst = tonumber(own or 0) elseif m.OWN == 'buckets' then buckets = tonumber(own or 0) end
  if (f[H_ALGORITHM] or 'tokenbucket') ~= m.NAME or (f[H_TYPE] or '0') ~= '0' or (f[H_MORE] or '') ~= ''
      or m.OWN == 'calendar' and (own or '') ~= '' or source == SOURCE_FIXED
      or not (rate and interval and burst and buckets and keepalive and rate % 1 + interval % 1 + burst % 1 + buckets % 1 + keepalive % 1 == 0
        and rate >= 1 and interval >= 1 and interval <= MAX and rate <= interval * 1000 and burst >= 0 and burst <= MAX
        and buckets >= 0 and buckets <= MAX_BUCKETS and (buckets == 0 and DEFAULT_BUCKETS or buckets) <= interval
        and keepalive >= 0 and keepalive <= MAX) then
    return REPLY_FULL_SCRIPT
  end
  stored, shadow = true, f[H_SHADOW] == '1' and 1 or 0
elseif arg ~= '' and not (f and not (f[m.STATE_AT] or f[m.STATE_AT + 1]) and source ~= SOURCE_FIXED) then
  local _, r, i, kind, b, bk, ka, rest = string.match(arg, CONFIG_ARG)
  if kind ~= '0' or ka ~= '0' or rest ~= '' then return REPLY_FULL_SCRIPT end
  rate, interval, burst, buckets = r + 0, i + 0, b + 0, bk + 0
else
  return REPLY_FULL_SCRIPT -- not initialized, or a hash decide.lua must look into
end
if burst == 0 then burst = rate end
if buckets == 0 then buckets = DEFAULT_BUCKETS end

-- Decide, and write, as decide.lua does for one rate.
local s = { rate = rate, interval = interval, burst = burst, buckets = buckets, K = '', where = key }
if f then
  m.load(s, f[m.STATE_AT], f[m.STATE_AT + 1], now)
elseif flat and flat ~= '' then
  if m.FIELD2 then
    local v1, v2 = string.match(flat, '^(%S*) ?(.*)$')
    m.load(s, v1, v2, now)
  else
    m.load(s, flat, nil, now)
  end
else
  m.load(s, nil, nil, now)
end
local permits = ARGV[a + A_PERMITS] + 0
local allowed, retry = 0, 0
if permits > m.capacity(s) then
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
if remaining > m.capacity(s) then remaining = m.capacity(s) elseif remaining < 0 then remaining = 0 end
local ms = (reset + (-reset) % 1000) / 1000
if ms < 1 then ms = 1 end
if allowed == 1 and permits > 0 then
  local moved, v1, v2 = m.encode(s, now)
  if not f then
    if not v1 then
      if flat then redis.call('DEL', key) end
    elseif moved then
      redis.call('SET', key, v2 and v1 .. ' ' .. v2 or v1, 'PX', string.format('%d', ms))
    else
      redis.call('SET', key, v2 and v1 .. ' ' .. v2 or v1, 'KEEPTTL')
    end
  else
    if v1 and m.FIELD2 then
      redis.call('HSET', key, m.FIELD1, v1, m.FIELD2, v2)
    elseif v1 then
      redis.call('HSET', key, m.FIELD1, v1)
    elseif m.FIELD2 then
      redis.call('HDEL', key, m.FIELD1, m.FIELD2)
    else
      redis.call('HDEL', key, m.FIELD1)
    end
    if moved and not stored then
      redis.call('PEXPIRE', key, string.format('%d', ms))
    end
  end
end
if stored and keepalive > 0 and permits > 0 then
  -- Every acquire keeps the config alive, granted or denied; state in the
  -- config hash keeps it alive as long as the state counts.
  local ttl = keepalive
  if reset > ttl * 1000 then ttl = ms end
  redis.call('PEXPIRE', key, ttl)
end
if not stored and source ~= SOURCE_FIXED and not f then
  return reply_default(allowed, remaining, retry, reset, nil)
end
local window = m.capacity(s) * interval / rate
window = window + (-window) % 1
return reply_full(f and REPLY_HASH or REPLY_FULL, allowed, m.capacity(s), remaining, retry, reset, window, shadow, 0, nil)
