-- An in-flight limit (inflight.go): at most limit holds at once across every
-- instance, each lost ttl ms after it was taken or last refreshed, so that a
-- crashed holder's slot comes back by itself. inflight.go assembles the
-- script: its header (the positions below, and the bounds), tools.lua, then
-- this file.
--
-- KEYS[1]  the limiter's hash: limit, ttl (ms) and algorithm = 'inflight',
--          as SetLimit stores them; absent while the handle's default rules.
--          It never expires, as a rate's config does not.
-- KEYS[2]  the holds: zset, member = the hold's id, score = when it expires,
--          in ms. A hold at score s is gone from s on (s <= now); a hold
--          released in time stays, at score -1, until the next sweep (see
--          release). The key expires with its latest hold.
-- ARGV, by the names the header declares (inflight.go's inflightArg*):
-- ARGV[OP]      acquire | refresh | release | holders | get | set | tryset | reset | delete
-- ARGV[NOW]     now in µs, or '' to read Redis TIME
-- ARGV[HOLD]    the hold's id (acquire, refresh, release)
-- ARGV[CONFIG]  '' (the stored config only), or 'SOURCE limit ttl-ms', which
--               Go has checked: SOURCE default (while none is stored) or new
--               (set, tryset)
-- Replies, integers only (and the holds' ids):
-- acquire  {1, ttl ms, limit}: granted (again, for a re-sent script: the id
--          is held already); {0, ms until the earliest hold expires, limit}:
--          limit holds or more are live
-- refresh  {HELD, ttl ms}: the hold expires ttl from now, or later if it
--          did already (see hold); {EXPIRED, 0}: it was there, expired;
--          {GONE, 0}: it was not there (dropped by reset or delete, lost
--          with Redis's data, swept once expired, or released)
-- release  HELD: the hold was live and is released (or was, by the same
--          release re-sent); EXPIRED: it had expired; GONE: it was not there
-- holders  {id, ms left, id, ms left, …} of the live holds, earliest first
-- get      {limit, ttl ms}, or {} when none is stored
-- set      1;  tryset  1 when it stored the config, 0 when one was stored
-- reset    1 when there were holds to drop, else 0
-- delete   1 when there was a key to delete, else 0
--
-- A hold's slot is the only thing counted: lowering limit evicts no one; the
-- holds above the new limit finish, and acquires wait until fewer than limit
-- remain. No call walks more than the holds that have expired (at most the
-- largest limit ever stored, which Go bounds by MAX_LIMIT) or the live ones.

local NOW_US
if ARGV[NOW] == '' then
  local t = redis.call('TIME')
  NOW_US = t[1] * 1000000 + t[2]
else
  NOW_US = ARGV[NOW] + 0
end
local NOW_MS = (NOW_US - NOW_US % 1000) / 1000
local op, CONF, HOLDS, id = ARGV[OP], KEYS[1], KEYS[2], ARGV[HOLD]

-- config reads the stored config, checking that the hash is this
-- algorithm's: a rate limiter of the same name (its config, Throttle's
-- state in the hash, or a flat state or marker in a string) is a mismatch,
-- never counted or overwritten. It returns the stored limit and ttl, or nil.
local function config()
  local f = read_config(CONF)
  if f.err then
    if call(CONF, 'TYPE', CONF).ok == 'string' then
      fail('algorithm ' .. CONF .. " holds a rate limiter's state, not " .. ALGORITHM)
    end
    corrupt(CONF, f.err)
  end
  -- A config without an algorithm field is Redisson's: a token bucket's.
  local other = f[3] or (f[4] or f[5]) and UNNAMED_ALGORITHM or state_owner(f)
  if other and other ~= ALGORITHM then
    local what = (f[3] or f[4] or f[5]) and ' config' or ' state'
    fail('algorithm ' .. CONF .. ' holds a ' .. other .. what .. ', not ' .. ALGORITHM)
  end
  if not f[3] then
    if f[1] or f[2] then
      corrupt(CONF, 'limit or ttl without algorithm')
    end
    return nil
  end
  local limit, ttl = integer(CONF, F_LIMIT, f[1], 1, MAX_LIMIT), integer(CONF, F_TTL, f[2], MIN_TTL, MAX_TTL)
  if not limit or not ttl then
    corrupt(CONF, 'limit or ttl missing')
  end
  return limit, ttl
end

-- given is the handle's config, or nil.
local function given()
  local limit, ttl = string.match(ARGV[CONFIG], '^%a+ (%d+) (%d+)$')
  if limit then
    return limit + 0, ttl + 0
  end
  return nil
end

-- in_force: the stored config, else the handle's default, else the error
-- ErrNotInitialized stands for.
local function in_force()
  local limit, ttl = config()
  if not limit then
    limit, ttl = given()
  end
  if not limit then
    fail('not initialized ' .. CONF)
  end
  return limit, ttl
end

-- hold keeps id until ttl from now, or until current, its expiry, if that
-- is later, and has the holds' key live at least ttl: PTTL is -1 on a key
-- just created. Never bringing an expiry forward is what lets a holder count
-- on every renewal it saw (Go's lease): each keeps the hold at least its ttl
-- past the moment it was sent, whatever order the calls ran in (a refresh
-- held up in the network and run after a later one) and whatever TTL a
-- later one had.
local function hold(ttl, current)
  if not current or current < NOW_MS + ttl then
    call(HOLDS, 'ZADD', HOLDS, NOW_MS + ttl, id)
  end
  if call(HOLDS, 'PTTL', HOLDS) < ttl then
    call(HOLDS, 'PEXPIRE', HOLDS, ttl)
  end
end

if op == OP_ACQUIRE then
  local limit, ttl = in_force()
  call(HOLDS, 'ZREMRANGEBYSCORE', HOLDS, '-inf', NOW_MS)
  -- Full when the limit-th hold exists. A re-sent script finds its own id
  -- among them, and is granted again: counted once.
  local mine = tonumber(call(HOLDS, 'ZSCORE', HOLDS, id))
  if #call(HOLDS, 'ZRANGE', HOLDS, limit - 1, limit - 1) > 0 and not mine then
    local earliest = call(HOLDS, 'ZRANGE', HOLDS, 0, 0, 'WITHSCORES')
    return { 0, tonumber(earliest[2]) - NOW_MS, limit }
  end
  hold(ttl, mine)
  return { 1, ttl, limit }
elseif op == OP_REFRESH then
  -- Read before the sweep takes it: a hold that expired is told apart from
  -- one that is not there at all.
  local expiry = tonumber(call(HOLDS, 'ZSCORE', HOLDS, id))
  local live = expiry and expiry ~= -1 and expiry > NOW_MS -- -1: released, which its holder knows
  -- What may refuse the call (a config corrupt, or deleted with no
  -- default) is read before the sweep writes: a script is not rolled back.
  local limit, ttl = nil, nil
  if live then
    limit, ttl = in_force()
  end
  call(HOLDS, 'ZREMRANGEBYSCORE', HOLDS, '-inf', NOW_MS)
  if not expiry or expiry == -1 then
    return { GONE, 0 }
  elseif not live then
    return { EXPIRED, 0 }
  end
  hold(ttl, expiry)
  return { HELD, ttl }
elseif op == OP_RELEASE then
  -- A hold released in time stays as a tombstone, score -1, which counts
  -- for nothing (it has expired) and goes with the next acquire's sweep: a
  -- re-sent release finds it, and answers as the first run did.
  local expiry = tonumber(call(HOLDS, 'ZSCORE', HOLDS, id))
  if expiry == -1 then
    return HELD
  elseif not expiry then
    return GONE
  elseif expiry <= NOW_MS then
    call(HOLDS, 'ZREM', HOLDS, id)
    return EXPIRED
  end
  call(HOLDS, 'ZADD', HOLDS, -1, id)
  return HELD
elseif op == OP_HOLDERS then
  local live = call(HOLDS, 'ZRANGEBYSCORE', HOLDS, '(' .. string.format('%d', NOW_MS), '+inf', 'WITHSCORES',
    'LIMIT', 0, MAX_LIMIT)
  for i = 2, #live, 2 do
    live[i] = tonumber(live[i]) - NOW_MS
  end
  return live
elseif op == OP_GET then
  local limit, ttl = config()
  if not limit then
    return {}
  end
  return { limit, ttl }
elseif op == OP_SET or op == OP_TRYSET then
  local stored = config()
  if stored and op == OP_TRYSET then
    return 0
  end
  local limit, ttl = given()
  call(CONF, 'HSET', CONF, F_LIMIT, limit, F_TTL, ttl, F_ALGORITHM, ALGORITHM)
  return 1
elseif op == OP_RESET then
  config() -- nor to drop holds of
  return call(HOLDS, 'DEL', HOLDS)
elseif op == OP_DELETE then
  config() -- another algorithm's keys are not this handle's to delete
  return call(CONF, 'DEL', CONF, HOLDS) > 0 and 1 or 0
end
fail('unknown op ' .. string.format('%q', op or ''))
