-- The decision skeleton. script.go assembles one script per algorithm: a
-- header from Go (local ALGORITHM, N, IN_CONFIG, RECORDS, MAX_RATES, BURST,
-- BUCKETS: the algorithm's stored name, its state keys per client, whether
-- its Overall state is fields of KEYS[1], whether its grants carry the
-- request id, the most rates a config holds, whether it has a burst or
-- buckets), this file and admin.lua. The algorithm's own file is never run as a whole: it is a list
-- of sections, each pasted where this file or admin.lua names it in a
-- marker: a comment holding @ and the name in double brackets.
--
-- Why pasting: Redis runs the whole chunk on every call, and every function
-- created or called and every table built costs about as much as a small
-- Redis command. So a decision is one straight block, the algorithm's steps
-- pasted into it, and only the few helpers below are created before it. The
-- rarer ops, and every error's full diagnosis, live in admin.lua, after the
-- block: their functions are only created when one is asked for.
--
-- KEYS[1]  the limiter's hash: its config (rate, interval ms, type and
--          keepAliveTime ms as Redisson keeps them; burst, buckets and
--          algorithm for ours) and, when IN_CONFIG, the Overall state too
-- KEYS[2 ..]  the Overall state keys, N of them (none when IN_CONFIG)
-- KEYS[REGISTRY]  client registry: zset of PerClient ids, score = last grant in ms
-- KEYS[REQUESTS]  request log: zset of recent request ids, score = when forgotten in ms
-- KEYS[REQUESTS + 1 ..]  this client's state keys, N of them (one when
--          IN_CONFIG: a hash), then those of each client named in ARGV[8 ..]
--          (see admin.lua's state_keys)
-- Every key costs the call about as much as a small command, so a decision
-- is sent with KEYS[1 .. REGISTRY - 1] only, unless its handle knows the
-- limiter is PerClient or logs requests: a PerClient config met with the
-- short list replies 'perclient', and the handle sends the whole list from
-- then on.
-- ARGV[1]  op: allow | release | get | set | tryset | reset | delete | expire | persist | ttl | clients
-- ARGV[2]  now in µs, or '' to read Redis TIME
-- ARGV[3]  permits (allow, release) or milliseconds (expire)
-- ARGV[4]  the handle's config: '' (the stored one only) or 'SOURCE rate
--          interval-ms type burst buckets keep-alive-ms [MORE]', which Go has
--          checked; SOURCE is default (while none is stored), fixed (whatever
--          is stored: Throttle) or new (SetRate); MORE, the config's further
--          rates as the hash's field more keeps them: 'rate interval-ms burst
--          buckets' each, space-separated
-- ARGV[5]  client id (sent with the whole key list only)
-- ARGV[6]  request id: the token bucket's record, the request log's entry
-- ARGV[7]  how long the request log keeps an id, ms; '' for no log
--          (a decision that needs neither is sent without ARGV[6 .. 7])
-- ARGV[8 ..]  other clients' ids (admin ops)
--
-- An algorithm's sections share these locals with the skeleton:
--   rate, interval (ms), kind (0 Overall, 1 PerClient), burst, buckets,
--   keepalive (ms), stored (a config is stored in KEYS[1]); where: the hash
--   holding the state, s1 and s2: its stored fields (IN_CONFIG); permits;
--   K: the suffix of the rate's state fields ('' for the config's own rate,
--   '2', '3' … for its further ones); longest: the longest interval of the
--   further rates.
-- With several rates, the steps below run once per rate: straight for the
-- config's own, and for each further rate inside a closure of its own
-- (other_rate), with that rate's rate, interval, burst, buckets and K.
-- The sections:
--   helpers   functions the others use, created before the decision
--   fields    , 'name' .. K … the state's hash fields (IN_CONFIG)
--   own_config  , 'burst' or , 'buckets' when it has one (script.go writes it)
--   capacity  the most one request may take: rate or burst
--   load      reads the state as of now into locals of its own
--   wait      sets wait: 0 or less when permits fit now, else µs until they do
--   commit    records a grant; sets counted = false for a grant recorded
--             already (a re-sent script)
--   resent    whether a re-sent script was granted (RECORDS), else false
--   report    sets remaining and reset, µs until the limiter is full again
--   release   gives back up to permits; sets back
--   admin     admin.lua's: TYPES (each state key's Redis type), FIELDS
--             (the state's hash fields) and settle(keys), which brings the
--             state in line after a rate change, or nil
--   more_load, more_wait, more_commit, more_report, more_release: a further
--             rate's steps when they differ from the first rate's (the token
--             bucket's: Redisson's layout holds its first rate only)
--
-- Every number written or returned is an integer: Lua numbers are doubles and
-- Redis truncates returned floats. A number given to redis.call is written
-- with %.17g, exact below 2^53; .. writes %.14g, exact below 10^14 only.
-- Errors are raised as plain strings
-- 'REDLIMIT …' at level 0 (no position); Redis and miniredis wrap them each
-- their own way, and script.go takes the message back out. The decision
-- uses operators where a call would do (x - x % 1 for floor, ARGV[i] + 0 for
-- tonumber) and trusts the numbers Go sends; what Redis stores is checked.

local MAX = 9007199254740992 -- 2^53
local NOW_US
if ARGV[2] == '' then
  local t = redis.call('TIME')
  NOW_US = t[1] * 1000000 + t[2]
else
  NOW_US = ARGV[2] + 0
end
local NOW_MS = (NOW_US - NOW_US % 1000) / 1000
local op, LOG = ARGV[1], ARGV[7] ~= nil and ARGV[7] ~= ''
local REGISTRY = IN_CONFIG and 2 or N + 2
local REQUESTS = REGISTRY + 1
local rate, interval, kind, burst, buckets, keepalive, stored
-- several: the config has further rates, whose state shares the hash of
-- the first rate's (IN_CONFIG); the decision then writes their fields in one
-- HSET (pending: field, value, …) and sets the hash's expiry once, for all.
local K, several, pending = '', false, nil

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

-- expiry converts a state key's TTL in µs to whole ms, rounding up. For a
-- key other than KEYS[1], it caps the TTL so that no key outlives a stored
-- config (Expire, ExpireAt).
local function expiry(ttl_us, key)
  local ttl_ms = (ttl_us + (-ttl_us) % 1000) / 1000
  if ttl_ms < 1 then ttl_ms = 1 end
  if key ~= KEYS[1] and stored and keepalive == 0 then
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 and left < ttl_ms then
      return left
    end
  end
  return ttl_ms
end

-- save writes one or two state fields (name, value) to the hash key and has it
-- expire when the limiter is full again, ttl_us from now; a nil ttl_us keeps
-- the expiry the key has (the windows set it once per window, not per grant).
-- KEYS[1] holding a stored config keeps the config's expiry (none, Expire's,
-- or the keep-alive the decision refreshes).
local function save(key, ttl_us, field, value, field2, value2)
  if several then
    local n = #pending
    pending[n + 1], pending[n + 2] = field, value
    if field2 then
      pending[n + 3], pending[n + 4] = field2, value2
    end
    return
  end
  if field2 then
    redis.call('HSET', key, field, value, field2, value2)
  else
    redis.call('HSET', key, field, value)
  end
  if ttl_us and (key ~= KEYS[1] or not stored) then
    redis.call('PEXPIRE', key, expiry(ttl_us, key))
  end
end

-- A client re-sends a script whose reply it did not read (go-redis does on a
-- read timeout). Counting it twice only denies sooner, so by default nothing
-- guards against it. With WithRetryWindow (LOG), the request log remembers
-- each request id for the window: first_run both checks and records the id,
-- and is false for a re-run, whose grant is counted already. (The token
-- bucket needs no log for its grants: its records hold the id.)
local first_run = LOG and function()
  if call(KEYS[REQUESTS], 'ZADD', KEYS[REQUESTS], 'NX', NOW_MS + ARGV[7], ARGV[6]) == 0 then
    return false
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[REQUESTS], '-inf', NOW_MS)
  redis.call('PEXPIRE', KEYS[REQUESTS], ARGV[7])
  return true
end

--[[@helpers]]

-- The decision (allow) and its inverse (release). A config that is missing
-- or fails a check here goes on to admin.lua, which says what is wrong.
if op == 'allow' or op == 'release' then
  -- f: rate, interval, type, keepAliveTime, algorithm, more, then burst
  -- (BURST) or buckets (BUCKETS), then the state's fields.
  local f = redis.pcall('HMGET', KEYS[1], 'rate', 'interval', 'type', 'keepAliveTime', 'algorithm', 'more'
    --[[@own_config]]--[[@fields]])
  if f.err then fail('corrupt ' .. KEYS[1] .. ': ' .. f.err) end
  stored = f[1] or f[2] or f[5]
  local ok, more = not stored and ARGV[4] ~= '', nil
  local S = (BURST or BUCKETS) and 8 or 7 -- the first state field
  if stored then
    -- The same checks as admin.lua's stored_config, which names the culprit.
    rate, interval, kind, keepalive = tonumber(f[1]), tonumber(f[2]), tonumber(f[3] or 0), tonumber(f[4] or 0)
    burst, buckets = 0, 0
    if BURST then burst = tonumber(f[7] or 0) elseif BUCKETS then buckets = tonumber(f[7] or 0) end
    ok = rate and interval and kind and burst and buckets and keepalive
        and rate % 1 + interval % 1 + kind % 1 + burst % 1 + buckets % 1 + keepalive % 1 == 0
        and rate >= 1 and rate <= MAX and interval >= 1 and interval <= MAX and (kind == 0 or kind == 1)
        and burst >= 0 and burst <= MAX and buckets >= 0 and buckets <= 1000 and keepalive >= 0 and keepalive <= MAX
        and (buckets == 0 and 10 or buckets) <= interval and rate <= interval * 1000
        and (f[5] or 'tokenbucket') == ALGORITHM
    more = f[6]
  end
  -- The handle's config: a default while none is stored, a fixed one
  -- (Throttle's) even over a stored one, which must still be sound. Go
  -- wrote it: a '0' needs no converting.
  if ok and ARGV[4] ~= '' and (not stored or string.sub(ARGV[4], 1, 6) == 'fixed ') then
    local r, i, t, b, bk, ka, rest = string.match(ARGV[4], '^%a+ (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) ?(.*)$')
    rate, interval, kind, more = r + 0, i + 0, t == '1' and 1 or 0, rest
    burst, buckets, keepalive = b == '0' and 0 or b + 0, bk == '0' and 0 or bk + 0, ka == '0' and 0 or ka + 0
  end
  -- The further rates, flat: rate, interval, burst, buckets of each. Each
  -- match starts where the last one ended, so the checks cover every byte.
  local rates
  if ok and more and more ~= '' then
    rates, several, pending = {}, true, {}
    local at = 1
    ok = string.byte(more, -1) ~= 32 -- a space
    while ok and at <= #more do
      local _, last, r, i, b, bk = string.find(more, '^(%d+) (%d+) (%d+) (%d+) ?', at)
      if not last or #rates == (MAX_RATES - 1) * 4 then
        ok = false
      else
        -- Only a funnel has a burst and only a sliding window buckets: the
        -- others' are '0', and turning a string into a number costs.
        r, i = r + 0, i + 0
        if b == '0' then b = r else b = b + 0 end
        if bk == '0' then bk = 10 else bk = bk + 0 end
        ok = r >= 1 and r <= i * 1000 and i <= MAX and b <= MAX and bk <= 1000 and bk <= i
        rates[#rates + 1], rates[#rates + 2], rates[#rates + 3], rates[#rates + 4] = r, i, b, bk
        at = last + 1
      end
    end
  end
  if ok and kind == 1 and not KEYS[REGISTRY] then
    return 'perclient' -- sent with the short key list: see KEYS above
  end
  if ok then
    if burst == 0 then burst = rate end
    if buckets == 0 then buckets = 10 end
    local where, s1, s2 = KEYS[1], f[S], f[S + 1]
    if IN_CONFIG and kind == 1 then
      where = KEYS[REQUESTS + 1]
      local g = call(where, 'HMGET', where--[[@fields]])
      s1, s2 = g[1], g[2]
    end
    local permits = ARGV[3] + 0
    --[[@load]]
    -- The further rates: each one's capacity (limits) and steps, a function
    -- of the step's name, 'wait', 'commit', 'report' or 'release'.
    local limits, steps, longest
    if rates then
      longest = 0
      for j = 2, #rates, 4 do
        if rates[j] > longest then longest = rates[j] end
      end
      local function other_rate(K, rate, interval, burst, buckets)
        local s1, s2
        if IN_CONFIG then
          local g = call(where, 'HMGET', where--[[@fields]])
          s1, s2 = g[1], g[2]
        end
        --[[@more_load]]
        local limit = --[[@capacity]]
        return limit, function(step)
          local wait, remaining, reset, back = 0, 0, 0, 0
          if step == 'wait' then
            --[[@more_wait]]
            return wait
          elseif step == 'commit' then
            --[[@more_commit]]
            return
          elseif step == 'release' then
            --[[@more_release]]
            return back
          end
          --[[@more_report]]
          if remaining > limit then remaining = limit elseif remaining < 0 then remaining = 0 end
          return remaining, reset
        end
      end
      limits, steps = {}, {}
      local suffixes = { '2', '3', '4' } -- MAX_RATES
      for j = 1, #rates, 4 do
        local i = #steps + 1
        limits[i], steps[i] = other_rate(suffixes[i], rates[j], rates[j + 1], rates[j + 2], rates[j + 3])
      end
    end
    local reply, reset, wrote = 0, 0, false
    if op == 'allow' then
      -- reply: 'allowed limit remaining retry reset window', integers in one
      -- string (one value for the client to read, not six): allowed 0 or 1,
      -- retry after µs (-1: never), reset after µs, window ms: the span
      -- limit applies to, the interval or the time a funnel's burst takes to
      -- drain. With several rates, limit and window are still the first
      -- rate's, and follow: the index of the rate that bound the answer (0
      -- for the first) and the further rates as more holds them, 'rate
      -- interval-ms burst buckets' each (the client works out their limits
      -- and windows: formatting them here would cost every call). Zero
      -- permits is a peek: it writes nothing.
      local limit = --[[@capacity]]
      local allowed, retry, wait, remaining, bound = 0, 0, 0, 0, 0
      if permits > limit then
        retry = -1
      else
        --[[@wait]]
      end
      if steps then
        -- Every rate must allow: a denial is bound by the longest wait.
        for i = 1, #steps do
          if permits > limits[i] then
            if retry ~= -1 then retry, bound = -1, i end
          elseif retry ~= -1 then
            local w = steps[i]('wait')
            if w > wait then
              wait = w
              if w > 0 then bound = i end -- a grant is bound by what it leaves
            end
          end
        end
      end
      if retry ~= -1 then
        if wait <= 0 then
          allowed = 1
          if permits > 0 and (RECORDS or not LOG or first_run()) then
            local counted = true
            --[[@commit]]
            if counted then
              wrote = true
              if steps then
                for i = 1, #steps do steps[i]('commit') end
              end
            end
            if counted and kind == 1 then
              -- The registry lets Delete, Reset and Expire reach every
              -- client's keys. It lives as long as any client's state can: one
              -- interval, or the time a funnel takes to drain when its burst
              -- exceeds its rate, the longest of any rate's.
              call(KEYS[REGISTRY], 'ZADD', KEYS[REGISTRY], NOW_MS, ARGV[5])
              local life = math.max(interval, burst * interval / rate)
              for j = 1, rates and #rates or 0, 4 do
                life = math.max(life, rates[j + 1], rates[j + 2] * rates[j + 1] / rates[j])
              end
              redis.call('PEXPIRE', KEYS[REGISTRY], expiry(life * 1000, KEYS[REGISTRY]))
            end
          end
        elseif permits > 0 and (--[[@resent]] or LOG and redis.call('ZSCORE', KEYS[REQUESTS], ARGV[6])) then
          allowed = 1 -- a re-sent script whose first run was granted
        else
          retry = wait
        end
      end
      --[[@report]]
      if remaining > limit then remaining = limit elseif remaining < 0 then remaining = 0 end
      local window = limit * interval / rate
      window = window + (-window) % 1
      if steps then

        for i = 1, #steps do
          local left, reset_i = steps[i]('report')
          if left < remaining then
            remaining = left
            if allowed == 1 then bound = i end
          end
          if reset_i > reset then reset = reset_i end
        end
        reply = string.format('%d %d %d %d %d %d %d ', allowed, limit, remaining, retry, reset, window, bound) .. more
      else
        reply = string.format('%d %d %d %d %d %d', allowed, limit, remaining, retry, reset, window)
      end
    elseif not LOG or first_run() then
      local back = 0
      --[[@release]]
      if steps then
        -- Every rate gives back what it can; the state's expiry follows the
        -- rate that is full again last.
        local remaining = 0
        --[[@report]]
        for i = 1, #steps do
          back = math.min(back, steps[i]('release'))
          local _, reset_i = steps[i]('report')
          if reset_i > reset then reset = reset_i end
        end
        wrote = true
      end
      reply = back
    end
    if several and #pending > 0 then
      redis.call('HSET', where, unpack(pending))
    end
    if several and wrote and IN_CONFIG and (where ~= KEYS[1] or not stored) then
      redis.call('PEXPIRE', where, expiry(math.max(reset, 1), where))
    end
    if stored and keepalive > 0 and permits > 0 then
      -- Every acquire keeps the config alive, granted or denied: a saturated
      -- limiter is busy, not idle. State in the config hash keeps it alive as
      -- long as the state counts (a funnel whose burst drains slower).
      local ttl = keepalive
      if op == 'allow' and IN_CONFIG and kind == 0 and reset > ttl * 1000 then
        ttl = (reset + (-reset) % 1000) / 1000
      end
      redis.call('PEXPIRE', KEYS[1], ttl)
    end
    return reply
  end
end
