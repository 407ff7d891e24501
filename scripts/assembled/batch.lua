-- Declared by script.go's header, from Go.
local OP, NOW, PERMITS, CONFIG, CALENDAR, ID, LOG_WINDOW, CLIENT_ID, OTHERS = 1, 2, 3, 4, 5, 6, 7, 8, 9 -- ARGV's
local MAX_RATES, DEFAULT_BUCKETS, MAX_BUCKETS = 4, 10, 1000
local RATE_SUFFIX = { '', '2', '3', '4' } -- a rate's state fields' suffix, by its place in the config
local REPLY_REMAINING = { h = 3, d = 2 } -- a reply's remaining, by its kind: the nth number after it
-- The decision skeleton. script.go assembles one script per algorithm: a
-- header from Go (script.go's header: the algorithm's stored name, ALGORITHM;
-- its state keys per client, N; whether its Overall state is fields of
-- KEYS[1], IN_CONFIG; whether its grants carry the request id, RECORDS;
-- whether it has a burst or buckets, BURST and BUCKETS, or calendar rates,
-- CALENDAR_RATES; and config.go's
-- bounds: MAX_RATES, DEFAULT_BUCKETS, MAX_BUCKETS, and RATE_SUFFIX, each
-- rate's state field suffix; the positions of the arguments, OP … OTHERS,
-- and of the keys, REGISTRY and REQUESTS, as Go sends them), this file and
-- admin.lua. The algorithm's own file is never run as a whole: it is a list
-- of sections, each pasted where this file or admin.lua names it in a
-- marker: a comment holding @ and the name in double brackets.
--
-- Why pasting: Redis runs the whole chunk on every call, and every function
-- created or called and every table built costs about as much as a small
-- Redis command, and so does each of the chunk's locals a function uses. So
-- a decision is one straight block, the algorithm's steps pasted into it.
-- tools.lua's helpers come after the block, where the rarer ops and every
-- error's full diagnosis (admin.lua) use them; an algorithm's own helpers,
-- before it, use none of the chunk's locals.
--
-- KEYS[1]  the limiter's hash: its config (rate, interval ms, type and
--          keepAliveTime ms as Redisson keeps them; burst, buckets and
--          algorithm for ours) and, when IN_CONFIG, the Overall state too;
--          or, when IN_CONFIG and no config is stored, a flat state: the
--          Overall state as a string, each rate's as its encode writes it,
--          ';' between them, with its expiry; or, while no config is
--          stored and the state is elsewhere (the token bucket's, any
--          PerClient state), a marker: the algorithm's name, expiring with
--          that state (see FOREIGN and the decision)
-- KEYS[2 ..]  the Overall state keys, N of them (none when IN_CONFIG)
-- KEYS[REGISTRY]  client registry: zset of PerClient ids, score = last grant in ms
-- KEYS[REQUESTS]  request log: zset of recent request ids, score = when forgotten in ms
-- KEYS[REQUESTS + 1 ..]  this client's state keys, N of them (one when
--          IN_CONFIG: a hash), then those of each client named in ARGV[OTHERS ..]
--          (see admin.lua's state_keys)
-- Every key costs the call about as much as a small command, so a decision
-- is sent with KEYS[1 .. REGISTRY - 1] only, unless its handle knows the
-- limiter is PerClient or logs requests: a PerClient config met with the
-- short list replies 'perclient', and the handle sends the whole list from
-- then on.
-- ARGV, by the names the header declares (call.go's arg constants):
-- ARGV[1]  OP: allow | release | get | set | tryset | reset | delete | expire | persist | ttl | clients
-- ARGV[2]  NOW: now in µs, or '' to read Redis TIME
-- ARGV[3]  PERMITS: permits (allow, release) or milliseconds (expire)
-- ARGV[4]  CONFIG: the handle's config: '' (the stored one only) or 'SOURCE rate
--          interval-ms type burst buckets keep-alive-ms [@CALENDARS] [MORE]',
--          which Go has checked; SOURCE is default (while none is stored;
--          defer: the same, from a handle whose last decision found a hash),
--          fixed (whatever is stored: Throttle) or new (SetRate); CALENDARS,
--          its rates that follow the calendar as the hash's field calendar
--          keeps them (config.go's calendars: 'place=period:anchor:zone',
--          ',' between them); MORE, the config's further rates as the
--          hash's field more keeps them: 'rate interval-ms burst buckets'
--          each, space-separated
-- ARGV[5]  CALENDAR: for a config with calendar rates, 'CALENDARS' and for
--          each of them the edges of three windows in ms, around the
--          client's clock (calendar.go); '' or absent for none
-- ARGV[6]  ID: request id: the token bucket's record, the request log's entry
--          (a decision that needs none is sent without it)
-- ARGV[7]  LOG_WINDOW: how long the request log keeps an id, ms; '' for no log
-- ARGV[8]  CLIENT_ID: client id (ARGV[7 .. 8] are sent with the whole key list only)
-- ARGV[9 ..]  OTHERS: other clients' ids (admin ops)
--
-- An algorithm's sections share these locals with the skeleton:
--   rate, interval (ms), kind (0 Overall, 1 PerClient), burst, buckets,
--   keepalive (ms), stored (a config is stored in KEYS[1]); where: the hash
--   holding the state, s1 and s2: its stored fields (IN_CONFIG); permits;
--   K: the suffix of the rate's state fields ('' for the config's own rate,
--   '2', '3' … for its further ones); longest: the longest interval of the
--   further rates; expire: set by encode when the state's expiry moves;
--   value: encode's; flat: a flat state read (see the decision);
--   flat_write: the state is written flat, by the skeleton.
-- With several rates, the steps run once per rate: straight for the
-- config's own, and for the further ones in two loops, with each one's
-- rate, interval, burst, buckets and K: before the decision, load and wait
-- (its s1 and s2 kept in states); after it, load again from them, then
-- commit and write, or release and write, then report.
-- The sections:
--   helpers   functions the others use, created before the decision: they
--             use only what they are given, and globals
--   fields    , 'name' .. K … the state's hash fields (IN_CONFIG)
--   own_config  , 'burst' or , 'buckets' when it has one (script.go writes it)
--   capacity  the most one request may take: rate or burst
--   load      reads the state as of now into locals of its own
--   wait      sets wait: 0 or less when permits fit now, else µs until they do
--   commit    counts a grant in the locals; sets counted = false for a grant
--             recorded already (a re-sent script)
--   release   gives back up to permits in the locals; sets back
--   encode    sets value, the state a commit or release left as one string
--             (a flat state: its fields' values, space-separated), nil when
--             nothing is left (write may do without it unless flat_write),
--             and expire when the state's expiry must move
--   write     writes the state as fields (HSET, or HDEL when nothing is
--             left); where expire is set, every field. The skeleton writes
--             a flat state and sets the expiry, once. It runs (with encode)
--             after a commit or release, or when a step set rewrite: a
--             state read wrong, to be written though nothing was counted
--   decode    sets s1 and s2 from flat, a rate's part of a flat state (IN_CONFIG)
--   resent    whether a re-sent script was granted (RECORDS), else false
--   report    sets remaining and reset, µs until the limiter is full again
--   admin     admin.lua's: TYPES (each state key's Redis type), FIELDS
--             (the state's hash fields) and settle(keys), which brings the
--             state in line after a rate change, or nil
--   more_load, more_wait, more_commit, more_encode, more_write, more_report,
--   more_release:
--             a further rate's steps when they differ from the first rate's
--             (the token bucket's: Redisson's layout holds its first rate only)
--   tools     tools.lua (script.go)
--
-- Every number written or returned is an integer: Lua numbers are doubles and
-- Redis truncates returned floats. A number given to redis.call is written
-- with %.17g, exact below 2^53, and string.format's %d writes it exactly for
-- less; .. writes %.14g, exact below 10^14 only.
-- Errors are raised as plain strings
-- 'REDLIMIT …' at level 0 (no position); Redis and miniredis wrap them each
-- their own way, and script.go takes the message back out. The decision
-- uses operators where a call would do (x - x % 1 for floor, ARGV[i] + 0 for
-- tonumber) and trusts the numbers Go sends; what Redis stores is checked.

local MAX = 9007199254740992 -- 2^53
local NOW_US
if ARGV[NOW] == '' then
  local t = redis.call('TIME')
  NOW_US = t[1] * 1000000 + t[2]
else
  NOW_US = ARGV[NOW] + 0
end
local NOW_MS = (NOW_US - NOW_US % 1000) / 1000
local op = ARGV[OP]
-- A batch's requests mostly share a config (ARGV[CONFIG]): each one is
-- parsed once per call, into configs (a lone call makes no table).
local configs = op == 'batch' and {} or nil

local makers = {}
makers['tokenbucket'] = function()
local ALGORITHM, N, IN_CONFIG, RECORDS, BURST, BUCKETS, CALENDAR_RATES = 'tokenbucket', 3, false, true, false, false, false
local REGISTRY, REQUESTS = 5, 6 -- KEYS': the client registry, the request log
-- >>> A batch's script (script.go's batchScript) holds what follows, up to
-- the decision's end, once per algorithm, and runs each request's decision
-- on its own keys and arguments: nothing here may read KEYS or ARGV but
-- the decision, which is given them.
-- A string in KEYS[1] is a flat state or a marker (see the decision), and
-- tells the algorithm that wrote it: a marker is the algorithm's name, and
-- each flat state has its own shape (its encode section), so no tag is
-- needed and state written before markers existed reads as it did: a
-- funnel's holds digits and ',' only, a fixed window's a space, a sliding
-- window's a ':' (';' between rates). FOREIGN matches every string this
-- algorithm did not write and, besides its marker, none it did; the token
-- bucket writes only its marker. admin.lua's attribution names the writer.
local FOREIGN = ALGORITHM == 'funnel' and '[^%d,;]' or ALGORITHM == 'fixed_window' and '^[^ ]*$'
    or ALGORITHM == 'sliding_window' and '^[^:]*$' or ''

--[[ helpers ]] -- Each function created costs a call about as much as a small Redis
-- command, and each of the script's locals it uses as much again: these use
-- none, only what they are given, and a grant calls three.

-- count is the permits of a record of log.
local function count(log, member)
  local n = #member
  if n < 5 then
    error('REDLIMIT corrupt ' .. log .. ': member of ' .. n .. ' bytes', 0)
  end
  local b1, b2, b3, b4 = string.byte(member, n - 3, n)
  return b1 + b2 * 256 + b3 * 65536 + b4 * 16777216
end

-- sum adds up the permits of records first, first + step, … of log until
-- they reach need (none: all of them), and says which record reached it.
local function sum(log, records, step, need)
  local total = 0
  for i = 1, #records, step do
    total = total + count(log, records[i])
    if need and total >= need then
      return total, i
    end
  end
  return total, nil
end

-- record is the log's member for a grant of permits by the request whose
-- head (0x10 and its id) is given.
local function record(permits, head)
  local p = permits
  return head .. string.char(p % 256, (p - p % 256) / 256 % 256,
    (p - p % 65536) / 65536 % 256, (p - p % 16777216) / 16777216 % 256)
end

-- slice finds the record a grant at now (ms) coalesces into: the newest at
-- or before the end of now's slice of interval, its score, and the slice's
-- start; the record is in the slice when its score is at or after the start.
local function slice(log, now, interval)
  local q = (interval + 63 - (interval + 63) % 64) / 64
  local start = now - now % q
  local newest = redis.call('ZREVRANGEBYSCORE', log, string.format('%d', start + q - 1), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  return newest[1], newest[2] and tonumber(newest[2]), start
end

-- sent says whether the grant of request id is the newest record up to
-- now's slice: a re-sent script, whose first run was granted (see the top).
-- newest, the log's newest record and its score when read already, is that
-- record unless it is stamped past the slice (by a clock ahead).
local function sent(log, now, interval, id, newest)
  local member
  local q = (interval + 63 - (interval + 63) % 64) / 64
  if newest and (not newest[2] or newest[2] + 0 < now - now % q + q) then
    member = newest[1]
  else
    member = slice(log, now, interval)
  end
  return member ~= nil and string.sub(member, 2, 17) == id
end

-- time_to_full is the µs from now until the newest record of log ages out
-- and the bucket is full again, 0 for none: newest, the record and its
-- score as ZRANGE … WITHSCORES gives them, when read already.
local function time_to_full(log, interval, now, newest)
  local score = (newest or redis.call('ZRANGE', log, -1, -1, 'WITHSCORES'))[2]
  local left = score and (score + interval) * 1000 - now or 0
  if left < 0 then left = 0 end
  return left
end

-- ttl is a state key's TTL for reset µs, in whole ms rounded up. Given the
-- config's key when it is stored and may expire (Expire, ExpireAt), no state
-- key outlives the config.
local function ttl(reset, config)
  local ms = (reset + (-reset) % 1000) / 1000
  if ms < 1 then ms = 1 end
  if config then
    local left = redis.call('PTTL', config)
    if left > 0 and left < ms then ms = left end
  end
  return string.format('%d', ms)
end

-- store caches value, with the value key and the log expiring after ms (a
-- string), when the log empties; with no ms, the log is empty now.
local function store(value_key, log, value, ms)
  if not ms then
    redis.call('DEL', value_key, log)
    return
  end
  redis.call('SET', value_key, string.format('%d', value), 'PX', ms)
  redis.call('PEXPIRE', log, ms)
end

-- running reads a record of the grants log (see more_load) whose member
-- ends in tag: the running total of permits after it, and its own permits.
local function running(grants, member, tag)
  local total, permits = string.match(member, '^(%d+):(%d+)' .. tag .. '$')
  if not total then
    error('REDLIMIT corrupt ' .. grants .. ': member ' .. string.format('%q', member), 0)
  end
  return tonumber(total), tonumber(permits) -- not + 0: gopher-lua (miniredis) reads 010 as octal
end

-- granted holds what each grant of this call of the script left in its log,
-- by the log's key: { now (ms), interval, the value, its record, the
-- record's score, the keys' TTL (ms) }. A batch's requests share the call
-- (batch.lua), and one on a log that a grant of the same time and interval
-- wrote before it, with no request on the log between, finds the state as
-- that grant left it: no record out of the window, the value cached, its
-- slice's record, and both keys expiring when this grant's would (the
-- same ms, on the same server clock). A grant on a hot key then runs 4
-- commands fewer.
local granted = {}

-- soonest: the last decision's shortest reset, µs, among its rates (reset
-- is the longest): a fixed window's first window to end, where a lease's
-- block must end too; since: when its grant starts to count down, µs, if
-- later than now: a funnel's, queued behind the permits before it (the
-- earliest of its rates'), which a lease's refund names (the lease op
-- below).
local soonest, since = 0, nil

-- The decision (allow) and its inverse (release), on a request's KEYS and
-- ARGV: its reply, or nil for a config that is missing or fails a check
-- here, which goes on to admin.lua, to say what is wrong.
local function decide(KEYS, ARGV)
  -- A batch's requests each carry their clock, or '' for the call's.
  local NOW_US, NOW_MS = NOW_US, NOW_MS
  since = nil
  if ARGV[NOW] ~= '' then
    NOW_US = ARGV[NOW] + 0
    NOW_MS = (NOW_US - NOW_US % 1000) / 1000
  end
  local op, LOG = ARGV[OP], ARGV[LOG_WINDOW] ~= nil and ARGV[LOG_WINDOW] ~= ''
  local rate, interval, kind, burst, buckets, keepalive, stored
  -- shadow: 1 when the stored config's limiter is in shadow mode (SetShadow).
  local shadow = 0
  -- spec: the config's calendar rates (CALENDARS above), or nil; calendar:
  -- their windows' edges, { b0, b1, b2, b3 } by their state fields' K.
  local spec, calendar = nil, nil
  -- K: the suffix of a rate's state fields, '' for the config's own rate.
  local K = ''

  -- A client re-sends a script whose reply it did not read (go-redis does on a
  -- read timeout). Counting it twice only denies sooner, so by default nothing
  -- guards against it. With WithRetryWindow (LOG), the request log remembers
  -- each request id for the window: first_run both checks and records the id,
  -- and is false for a re-run, whose grant is counted already. (The token
  -- bucket's records hold the id of their latest grant too: see its file.)
  local first_run = LOG and function()
    local added = redis.pcall('ZADD', KEYS[REQUESTS], 'NX', NOW_MS + ARGV[LOG_WINDOW], ARGV[ID])
    if type(added) == 'table' then
      error('REDLIMIT corrupt ' .. KEYS[REQUESTS] .. ': ' .. added.err, 0)
    end
    if added == 0 then
      return false
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[REQUESTS], '-inf', NOW_MS)
    redis.call('PEXPIRE', KEYS[REQUESTS], ARGV[LOG_WINDOW])
    return true
  end

  -- KEYS[1] is a hash, or, for an IN_CONFIG algorithm, a flat state: while
  -- no config is stored, the Overall state as a plain string (each rate's
  -- as its encode section writes it), which GET reads and SET … PX writes
  -- at less cost than HMGET, HSET and PEXPIRE. Each read is the likelier
  -- one first, and costs a failed command when wrong: GET for a default
  -- whose last decision found no hash (SOURCE default), HMGET for any
  -- other (defer, a stored config only, fixed); a token bucket's default
  -- only asks whether the hash exists. d and a: ARGV[4]'s first and fourth
  -- bytes, 'd' for either default and 'a' for default.
  -- f: rate, interval, type, keepAliveTime, algorithm, more, shadow, then
  -- burst (BURST) or buckets (BUCKETS), then the state's fields, or nil; flat:
  -- the flat state, or nil; none: KEYS[1] does not exist.
  local d, _, _, a = string.byte(ARGV[CONFIG], 1, 4)
  local f, flat, none, marked = nil, nil, false, false
  if a == 97 then
    local got = redis.pcall('GET', KEYS[1])
    if not got then none = true elseif not got.err then flat = got end
  end
  if not flat and not none then
    f = redis.pcall('HMGET', KEYS[1], 'rate', 'interval', 'type', 'keepAliveTime', 'algorithm', 'more', 'shadow'
      --[[ own_config ]] --[[ fields ]] )
    if not f.err then
      stored = f[1] or f[2] or f[5]
    elseif redis.call('TYPE', KEYS[1]).ok == 'string' then
      flat, f = redis.call('GET', KEYS[1]), nil
    else
      error('REDLIMIT corrupt ' .. KEYS[1] .. ': ' .. f.err, 0)
    end
  end
  -- One algorithm's state is never counted by another: a string another
  -- wrote (see FOREIGN) goes to admin.lua, which names it. This
  -- algorithm's marker says only that its state is elsewhere: none here.
  local foreign = false
  if flat and string.find(flat, FOREIGN) then
    if flat == ALGORITHM then flat, none, marked = nil, true, true else foreign = true end
  end
  local ok, more = not stored and ARGV[CONFIG] ~= '' and not foreign, nil
  local S = (BURST or BUCKETS or CALENDAR_RATES) and 9 or 8 -- the first state field
  -- A default that found a hash with neither config nor state of its own
  -- (its first rate's): a defer sees whether KEYS[1] is there at all, and if
  -- not, writes the state flat, and the short reply sends the handle back
  -- to default; else a hash of another algorithm's fields (as Throttle
  -- leaves a funnel's) goes to admin.lua too. Not on the usual paths.
  if f and not stored and d == 100 and not (IN_CONFIG and (f[S] or f[S + 1])) then
    if IN_CONFIG and a == 101 and redis.call('EXISTS', KEYS[1]) == 0 then
      f, none = nil, true
    else
      local g = redis.call('HMGET', KEYS[1], 'tat', 'window', 'counts')
      ok = ok and not (g[1] or g[2] or g[3]) -- this algorithm's own are empty
    end
  end
  if stored then
    -- The same checks as admin.lua's stored_config, which names the culprit.
    rate, interval, kind, keepalive = tonumber(f[1]), tonumber(f[2]), tonumber(f[3] or 0), tonumber(f[4] or 0)
    burst, buckets = 0, 0
    if BURST then burst = tonumber(f[8] or 0) elseif BUCKETS then buckets = tonumber(f[8] or 0) elseif CALENDAR_RATES and f[8] and f[8] ~= '' then spec = f[8] end
    ok = rate and interval and kind and burst and buckets and keepalive
        and rate % 1 + interval % 1 + kind % 1 + burst % 1 + buckets % 1 + keepalive % 1 == 0
        and rate >= 1 and rate <= (RECORDS and 4294967295 or MAX) and interval >= 1 and interval <= MAX and (kind == 0 or kind == 1)
        and burst >= 0 and burst <= MAX and buckets >= 0 and buckets <= MAX_BUCKETS and keepalive >= 0 and keepalive <= MAX
        and (buckets == 0 and DEFAULT_BUCKETS or buckets) <= interval and rate <= interval * 1000
        and (f[5] or 'tokenbucket') == ALGORITHM
    more = f[6]
    if f[7] == '1' then shadow = 1 end
  end
  -- The handle's config: a default while none is stored, a fixed one
  -- (Throttle's) even over a stored one, which must still be sound. Go
  -- wrote it: a '0' needs no converting.
  if ok and ARGV[CONFIG] ~= '' and (not stored or string.sub(ARGV[CONFIG], 1, 6) == 'fixed ') then
    local parsed = configs and configs[ARGV[CONFIG]]
    if parsed then
      rate, interval, more, kind, burst, buckets, keepalive, spec = unpack(parsed)
    else
      local r, i, options, rest = string.match(ARGV[CONFIG], '^%a+ (%d+) (%d+) (%d+ %d+ %d+ %d+) ?(.*)$')
      spec = nil
      if string.byte(rest, 1) == 64 then -- '@': calendar rates
        spec, rest = string.match(rest, '^@(%S+) ?(.*)$')
      end
      rate, interval, more = r + 0, i + 0, rest
      kind, burst, buckets, keepalive = 0, 0, 0, 0
      if options ~= '0 0 0 0' then -- Overall, no burst, buckets or keep-alive: most defaults
        local t, b, bk, ka = string.match(options, '^(%d+) (%d+) (%d+) (%d+)$')
        kind, burst, buckets, keepalive = t + 0, b + 0, bk + 0, ka + 0
      end
      if configs then
        configs[ARGV[CONFIG]] = { rate, interval, more, kind, burst, buckets, keepalive, spec }
      end
    end
  end
  -- The further rates, n of them: rate, interval, burst, buckets of each,
  -- flat. Each match starts where the last one ended, so the checks cover
  -- every byte.
  local rates, n = nil, 0
  if ok and more and more ~= '' then
    local last = 0
    ok = string.byte(more, -1) ~= 32 -- a space
    while ok and last < #more do
      local _, r, i, b, bk
      _, last, r, i, b, bk = string.find(more, '^(%d+) (%d+) (%d+) (%d+) ?', last + 1)
      if not last or n == MAX_RATES - 1 then
        ok = false
      else
        -- Only a funnel has a burst and only a sliding window buckets: the
        -- others' are '0', and turning a string into a number costs.
        r, i = r + 0, i + 0
        if b == '0' then b = r else b = b + 0 end
        if bk == '0' then bk = DEFAULT_BUCKETS else bk = bk + 0 end
        ok = r >= 1 and r <= i * 1000 and i <= MAX and b <= MAX and bk <= MAX_BUCKETS and bk <= i
        if rates then
          local j = 4 * n
          rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4] = r, i, b, bk
        else
          rates = { r, i, b, bk } -- built whole: one further rate is the usual
        end
        n = n + 1
      end
    end
  end
  if ok and kind == 1 and not KEYS[REGISTRY] then
    return 'perclient' -- sent with the short key list: see KEYS above
  end
  -- Calendar rates count in windows whose edges Go sent (ARGV[CALENDAR]);
  -- a request that sent none, or another config's, is told which to send.
  ok = ok and (not spec or CALENDAR_RATES)
  if ok and spec then
    local given, edges = string.match(ARGV[CALENDAR] or '', '^(%S+) (.*)$')
    if given ~= spec then
      return 'calendar ' .. spec
    end
    local list, at = {}, 0
    for edge in string.gmatch(edges, '%d+') do list[#list + 1] = edge + 0 end
    calendar = {}
    for place in string.gmatch(spec, '(%d+)=') do
      ok = ok and place + 0 <= n + 1 -- a rate of the config's (admin.lua names one that is not)
      calendar[RATE_SUFFIX[place + 0] or ''] = { list[at + 1], list[at + 2], list[at + 3], list[at + 4] }
      at = at + 4
    end
  end
  if ok then
    if burst == 0 then burst = rate end
    if buckets == 0 then buckets = DEFAULT_BUCKETS end
    -- A flat state holds each rate's part, ';' between them; rest: the
    -- parts after the one read, kept for the further rates (and, beyond
    -- this handle's, for another handle's default that has more).
    local where, s1, s2, rest = KEYS[1], nil, nil, nil
    if f then
      s1, s2 = f[S], f[S + 1]
    elseif flat then
      local cut = string.find(flat, ';', 1, true)
      if cut then -- not one assignment: gopher-lua (miniredis) assigns flat before it reads it again
        rest = string.sub(flat, cut + 1)
        flat = string.sub(flat, 1, cut - 1)
      end
      if flat ~= '' then
        --[[ decode ]] 
      end
    end
    -- The state is written flat when it can be: see above.
    local flat_write = IN_CONFIG and not f and kind == 0
    if IN_CONFIG and kind == 1 then
      where = KEYS[REQUESTS + 1]
      local g = redis.pcall('HMGET', where--[[ fields ]] )
      if g.err then error('REDLIMIT corrupt ' .. where .. ': ' .. g.err, 0) end
      s1, s2 = g[1], g[2]
    end
    -- charge: a grant whatever the limit says (Limiter.Charge), counted as
    -- any grant, so that what it takes past the limit is a debt the next
    -- requests wait out.
    local charge = op == 'charge'
    -- grant_at and grant_size: a refund's grant, its time in µs on Redis's
    -- clock and its permits (PERMITS is 'permits since granted': a lease
    -- giving back what it did not use of a block), so that each rate's
    -- release gives back only what is still counted of that grant, and
    -- never what later grants or time have made another's.
    local permits, grant_at, grant_size, decide = ARGV[PERMITS], nil, nil, op == 'allow' or charge
    if op == 'refund' then
      local n, t, g = string.match(permits, '^(%d+) (%d+) (%d+)$')
      if not n or n + 0 > g + 0 then
        error('REDLIMIT refund ' .. string.format('%q', permits) .. ': want "permits since-µs granted"', 0)
      end
      permits, grant_at, grant_size = n + 0, t + 0, g + 0
    else
      permits = permits + 0
    end
    local allowed, retry, wait, remaining, reset, bound, back = 0, 0, 0, 0, 0, 0, 0
    -- expire: a step wrote state whose expiry must move (IN_CONFIG), and
    -- then writes every field; wrote: a step wrote anything; rewrite: the
    -- state read must be written though nothing was counted (the token
    -- bucket's cache, found wrong); value: the state as encode left it.
    local expire, wrote, rewrite, value = false, false, false, nil
    --[[ load ]] -- The permits available: rate − Σ(log in the window). The value key caches
-- rate − Σ(log), as Redisson keeps it: the records that left the window
-- (aged: how many) give theirs back here, and go when the state is written.
-- When the cache is missing or impossible the log is summed again, so
-- losing it never resets the limiter; when it is missing the whole log is
-- read at once (a new limiter's first grant reads an empty log once). What
-- a grant of this call left (granted) is not read again.
-- changed: the cache is wrong; empty: the log is empty; newest: the log's
-- newest record and its score, once read; full_after: µs until the bucket is
-- full again, once known; seen: granted's entry for the log, taken (a grant
-- puts one back); mine, mine_at: the grant's record and score, when it is
-- its slice's only one.
local value_key, log = KEYS[2 + kind * (REQUESTS - 1)], KEYS[3 + kind * (REQUESTS - 1)]
local cutoff = string.format('%d', NOW_MS - interval)
local aged, available, changed, empty, newest, full_after = 0, 0, false, false, nil, nil
local seen, mine, mine_at = granted[log], nil, nil
granted[log] = nil
if seen and (seen[1] ~= NOW_MS or seen[2] ~= interval) then
  seen = nil
end
if seen then
  available = seen[3]
  if available > rate then -- a handle of a lower rate
    available, changed = rate - sum(log, redis.call('ZRANGEBYSCORE', log, '(' .. cutoff, '+inf'), 1), true
  end
else
  local got = redis.pcall('GET', value_key)
  local cached = got and tonumber(got) -- nil for an error, or what is not a number
  if got and not (cached and cached % 1 == 0 and cached >= -MAX and cached <= MAX) then
    error('REDLIMIT corrupt ' .. value_key .. ': ' .. (got.err or 'field value = ' .. string.format('%q', got)), 0)
  end
  local records
  if cached then
    records = redis.pcall('ZRANGEBYSCORE', log, '-inf', cutoff)
  else
    records = redis.pcall('ZRANGEBYSCORE', log, '-inf', '+inf', 'WITHSCORES')
  end
  if records.err then
    error('REDLIMIT corrupt ' .. log .. ': ' .. records.err, 0)
  end
  if cached then
    aged, available = #records, cached + sum(log, records, 1)
    if available > rate then
      available, changed = rate - sum(log, redis.call('ZRANGEBYSCORE', log, '(' .. cutoff, '+inf'), 1), true
    end
  else
    local used, out = 0, NOW_MS - interval
    for i = 1, #records, 2 do
      local n = count(log, records[i])
      if records[i + 1] + 0 <= out then aged = aged + 1 else used = used + n end
    end
    available, changed, empty = rate - used, true, #records == 0
  end
end
    local limit = --[[ capacity ]] rate
    if decide then
      if permits > limit and not charge then
        retry = -1
      else
        --[[ wait ]] -- Enough of the oldest records in the window must age out: of one permit or
-- more each, so need records at most. When the whole window frees too few,
-- the cached value was too low (a value key without its log): the log is
-- the truth, and the value is rebuilt from it. A denial reads the newest
-- record, once, for resent and report.
if permits > available then
  local need = permits - available
  local records = redis.call('ZRANGEBYSCORE', log, '(' .. cutoff, '+inf', 'WITHSCORES', 'LIMIT', 0, need)
  local freed, at = sum(log, records, 2, need)
  if not at and #records / 2 < need and available ~= rate - freed then
    available, changed, need = rate - freed, true, permits - (rate - freed)
    if need > 0 then
      freed, at = sum(log, records, 2, need)
    end
  end
  if at then
    wait = (records[at + 1] + interval) * 1000 - NOW_US
  elseif need > 0 then
    wait = interval * 1000 -- records of several permits each: a full interval frees them all
  end
  if wait > 0 then
    newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  end
end
-- A decision that is no grant still writes a cache it found wrong, as a
-- Redisson client sharing the limiter reads the value key alone.
if changed and permits > 0 then
  rewrite = true
end
      end
    end
    -- The further rates are read before anything is written: each one's
    -- state goes into states, for its steps after the decision, and a
    -- decision weighs its wait. Every rate must allow: a denial is bound by
    -- the longest wait, or by the first rate that can never grant so many.
    local states, longest
    if rates then
      states, longest = { nil, nil }, 0 -- sized for one further rate, the usual
      local most = wait
      for i = 1, n do
        local j, K = 4 * i - 4, RATE_SUFFIX[i + 1]
        local rate, interval, burst, buckets = rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4]
        if interval > longest then longest = interval end
        local s1, s2
        if IN_CONFIG and (f or where ~= KEYS[1]) then
          local g = redis.pcall('HMGET', where--[[ fields ]] )
          if g.err then error('REDLIMIT corrupt ' .. where .. ': ' .. g.err, 0) end
          s1, s2 = g[1], g[2]
        elseif rest then
          local flat, cut = rest, string.find(rest, ';', 1, true)
          rest = nil
          if cut then
            rest = string.sub(flat, cut + 1)
            flat = string.sub(flat, 1, cut - 1)
          end
          if flat ~= '' then
            --[[ more_decode ]] 
          end
        end
        --[[ more_load ]] -- A further rate cannot share Redisson's log: a Java client prunes it to the
-- first rate's interval. It keeps records of its own in the grants log,
-- each rate in a range of scores of its own: rate k's are its grants' times
-- in ms plus (k − 2) × 2^45 (2^45 ms is 1,115 years; every score stays below
-- 2^53). A member is the running total of the rate's permits after the
-- record and the record's own permits, '%016d:%d', then ':k' for k > 2, so
-- that no two rates' members are equal. Its grants coalesce by slices of its
-- interval, as the first rate's do (see the top): at most 65 records each.
-- A rate's usage is its newest total less the total before its oldest
-- record in the window: two lookups. The steps after the decision load it
-- again from s1 (the usage) and s2 (the newest record's total, time in ms
-- and member). base, top: the rate's range of scores; since: the window's
-- start, for ZRANGEBYSCORE.
local grants, base, tag = KEYS[4 + kind * (REQUESTS - 1)], (K - 2) * 35184372088832, K == '2' and '' or ':' .. K
local top = '(' .. string.format('%d', base + 35184372088832)
local since = '(' .. string.format('%d', base + NOW_MS - interval)
if not s1 then
  local newest = redis.pcall('ZREVRANGEBYSCORE', grants, top, string.format('%d', base), 'WITHSCORES', 'LIMIT', 0, 1)
  if newest.err then
    error('REDLIMIT corrupt ' .. grants .. ': ' .. newest.err, 0)
  end
  s1, s2 = 0, { 0, 0, nil }
  if #newest > 0 then
    s2 = { running(grants, newest[1], tag), tonumber(newest[2]) - base, newest[1] }
    local oldest = redis.call('ZRANGEBYSCORE', grants, since, top, 'LIMIT', 0, 1)
    if #oldest > 0 then
      local after, n = running(grants, oldest[1], tag)
      s1 = s2[1] - (after - n)
    end
  end
end
local used, total, last = s1, s2[1], s2[2]
        if calendar then rates[j + 2] = interval end -- a calendar window's own length (load)
        states[2 * i - 1], states[2 * i] = s1, s2
        local limit = --[[ capacity ]] rate
        if decide and retry ~= -1 then
          if permits > limit and not charge then
            retry, bound = -1, i
          else
            local wait = 0
            --[[ more_wait ]] -- Enough of the oldest records in the window must leave it: records of one
-- permit or more, so need records at most.
local need = used + permits - rate
if need > 0 then
  wait = interval * 1000 -- not reached: permits <= rate, so the window holds enough to free
  local base_total = total - used
  local records = redis.call('ZRANGEBYSCORE', grants, since, top, 'WITHSCORES', 'LIMIT', 0, need)
  for i = 1, #records, 2 do
    if running(grants, records[i], tag) - base_total >= need then
      wait = (tonumber(records[i + 1]) - base + interval) * 1000 - NOW_US
      break
    end
  end
end
            if wait > most then
              most = wait
              if wait > 0 then bound = i end -- a grant is bound by what it leaves
            end
          end
        end
      end
      wait = most
    end
    if charge then
      wait = 0
    end
    local counted = false
    if decide and retry ~= -1 then
      -- Zero permits is a peek: it writes nothing.
      if wait <= 0 then
        allowed = 1
        if permits > 0 and (not LOG or first_run()) then
          counted = true
          --[[ commit ]] -- The grant joins its slice's record (see the top), which takes its time
-- and id: a record whose id is this request's is its own first run's. Its
-- member is written before the old one goes, with NX: a member there
-- already is this request's too (alone in an older record). A re-sent
-- script, not counted, still writes a state it found wrong or aged.
local member, score, start
if seen then
  local q = (interval + 63 - (interval + 63) % 64) / 64
  member, score, start = seen[4], seen[5], NOW_MS - NOW_MS % q
elseif not empty then
  member, score, start = slice(log, NOW_MS, interval)
end
if member and string.sub(member, 2, 17) == ARGV[ID] then
  counted = false
else
  local n, at, merge = permits, NOW_MS, member and score >= start
  if merge then
    n = n + count(log, member)
    merge = n <= 4294967295 -- the record's count fits its 4 bytes: else a record of its own
    if not merge then
      n = permits
    elseif score > at then
      at = score -- a grant stamped later, by a client whose clock is ahead
    end
  end
  local grant = record(n, '\16' .. ARGV[ID])
  counted = redis.call('ZADD', log, 'NX', string.format('%d', at), grant) == 1
  if counted then
    if merge then
      redis.call('ZREM', log, member)
    end
    available, changed, full_after = available - permits, true, (at + interval) * 1000 - NOW_US
    if merge or not (member and score >= start) then
      mine, mine_at = grant, at
    end
  end
end
rewrite = not counted and (changed or aged > 0)
          wrote = counted
        end
      elseif permits > 0 and (--[[ resent ]] sent(log, NOW_MS, interval, ARGV[ID], newest) or LOG and redis.call('ZSCORE', KEYS[REQUESTS], ARGV[ID])) then
        allowed = 1 -- a re-sent script whose first run was granted
      else
        retry = wait
      end
    elseif op == 'refund' and redis.call('ZREM', KEYS[REQUESTS], ARGV[ID]) == 1
        or op ~= 'refund' and not decide and (not LOG or first_run()) then
      -- A refund names its take's id, which the take left in the request
      -- log: it gives back once, and nothing after whatever forgot the log
      -- (Reset, Delete, a change of rates: the state its grant was counted
      -- in is gone, or counts otherwise).
      wrote = true
      --[[ release ]] -- A refund gives back nothing: a further rate's log holds running totals,
-- so taking permits off an older record would rewrite every later one.
-- A lease's unused permits so count until they age out.
if grant_at then permits = 0 end
-- Permits come off the newest records, so that the log and the value stay
-- in agreement; a record partly given back keeps its time and id. Records
-- are read 64 at a time: a log of ours holds fewer (see the top). What they
-- show of the newest record left says when the bucket is full again:
-- last, its score; ended, the log's last records were read.
if aged > 0 then
  redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  aged = 0
end
local left, last, ended = permits, nil, false
while left > 0 do
  local records = redis.call('ZREVRANGE', log, 0, 63, 'WITHSCORES')
  ended = #records < 128
  if #records == 0 then
    break
  end
  local gone = {}
  for i = 1, #records, 2 do
    local member = records[i]
    local n = count(log, member)
    gone[#gone + 1] = member
    if n > left then
      redis.call('ZADD', log, records[i + 1], record(n - left, string.sub(member, 1, #member - 4)))
      n, last = left, records[i + 1]
    end
    left = left - n
    if left == 0 then
      last = last or records[i + 3]
      break
    end
  end
  redis.call('ZREM', log, unpack(gone))
end
if last then
  full_after = (last + interval) * 1000 - NOW_US
elseif ended then
  full_after = 0
end
available, back = available + permits - left, permits - left
    end
    -- What a commit or release left (or a state to rewrite), written as
    -- fields; a flat state is written below, with its expiry.
    if wrote or rewrite then
      --[[ encode ]] -- Never flat: Redisson's layout is a hash.
      if not flat_write then
        --[[ write ]] -- What a grant, a release or a decision that found the cache wrong left:
-- the records out of the window go, and the value is cached, both keys
-- expiring when the newest record ages out; after a grant of this call at
-- the same time (seen), the log's expiry stands. A grant's is kept in
-- granted.
if aged > 0 then
  redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
end
full_after = full_after or time_to_full(log, interval, NOW_US, newest)
if seen and counted then
  redis.call('SET', value_key, string.format('%d', available), 'PX', seen[6])
else
  local ms = full_after > 0 and ttl(full_after, stored and keepalive == 0 and KEYS[1])
  store(value_key, log, available, ms)
  seen = counted and { NOW_MS, interval, available, nil, nil, ms }
end
if mine then
  seen[3], seen[4], seen[5] = available, mine, mine_at
  granted[log] = seen
end
      end
    end
    --[[ report ]] -- The bucket is full again when its newest record ages out.
remaining, reset = available, full_after or time_to_full(log, interval, NOW_US, newest)
    if remaining > limit then remaining = limit elseif remaining < 0 then remaining = 0 end
    soonest = reset
    -- The further rates' steps, each from the state read before: a grant
    -- counts in every one, a release gives back in every one, and the answer
    -- is the smallest remaining and the longest reset.
    -- parts: the further rates' parts of a flat state, each after a ';';
    -- moved: the expiry of one of them moves; kept: one of them is not empty.
    local parts, moved, kept
    if rates then
      local least, latest, given = remaining, reset, back
      for i = 1, n do
        local j, K = 4 * i - 4, RATE_SUFFIX[i + 1]
        local rate, interval, burst, buckets = rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4]
        local s1, s2 = states[2 * i - 1], states[2 * i]
        --[[ more_load ]] -- A further rate cannot share Redisson's log: a Java client prunes it to the
-- first rate's interval. It keeps records of its own in the grants log,
-- each rate in a range of scores of its own: rate k's are its grants' times
-- in ms plus (k − 2) × 2^45 (2^45 ms is 1,115 years; every score stays below
-- 2^53). A member is the running total of the rate's permits after the
-- record and the record's own permits, '%016d:%d', then ':k' for k > 2, so
-- that no two rates' members are equal. Its grants coalesce by slices of its
-- interval, as the first rate's do (see the top): at most 65 records each.
-- A rate's usage is its newest total less the total before its oldest
-- record in the window: two lookups. The steps after the decision load it
-- again from s1 (the usage) and s2 (the newest record's total, time in ms
-- and member). base, top: the rate's range of scores; since: the window's
-- start, for ZRANGEBYSCORE.
local grants, base, tag = KEYS[4 + kind * (REQUESTS - 1)], (K - 2) * 35184372088832, K == '2' and '' or ':' .. K
local top = '(' .. string.format('%d', base + 35184372088832)
local since = '(' .. string.format('%d', base + NOW_MS - interval)
if not s1 then
  local newest = redis.pcall('ZREVRANGEBYSCORE', grants, top, string.format('%d', base), 'WITHSCORES', 'LIMIT', 0, 1)
  if newest.err then
    error('REDLIMIT corrupt ' .. grants .. ': ' .. newest.err, 0)
  end
  s1, s2 = 0, { 0, 0, nil }
  if #newest > 0 then
    s2 = { running(grants, newest[1], tag), tonumber(newest[2]) - base, newest[1] }
    local oldest = redis.call('ZRANGEBYSCORE', grants, since, top, 'LIMIT', 0, 1)
    if #oldest > 0 then
      local after, n = running(grants, oldest[1], tag)
      s1 = s2[1] - (after - n)
    end
  end
end
local used, total, last = s1, s2[1], s2[2]
        local limit = --[[ capacity ]] rate
        local remaining, reset, back = 0, 0, 0
        if counted then
          --[[ more_commit ]] -- The grant joins its slice's record, whose time never goes back, so that
-- the totals grow with the scores. A new record first drops the rate's
-- records out of its window: between two new records nothing is added, so
-- the rate never holds more than 65.
used = used + permits
local q = (interval + 63 - (interval + 63) % 64) / 64
local member, n = s2[3], permits
if member and last >= NOW_MS - NOW_MS % q then
  local _, had = running(grants, member, tag)
  n = n + had
  redis.call('ZREM', grants, member)
else
  redis.call('ZREMRANGEBYSCORE', grants, string.format('%d', base), string.format('%d', base + NOW_MS - interval))
end
if last < NOW_MS then last = NOW_MS end
total = total + permits
redis.call('ZADD', grants, string.format('%d', base + last), string.format('%016d:%d', total, n) .. tag)
if K == '2' then
  redis.call('PEXPIRE', grants, ttl((last + longest) * 1000 - NOW_US, stored and keepalive == 0 and KEYS[1]))
end
        elseif wrote then
          --[[ more_release ]] -- Permits come off the rate's newest records in its window, as the first
-- rate's do; the newest left then says when the rate is full again.
back = math.min(permits, used)
used = used - back
local left = back
while left > 0 do
  local records = redis.call('ZREVRANGEBYSCORE', grants, top, since, 'WITHSCORES', 'LIMIT', 0, 64)
  if #records == 0 then
    break
  end
  local gone = {}
  for i = 1, #records, 2 do
    local after, n = running(grants, records[i], tag)
    gone[#gone + 1] = records[i]
    if n > left then
      redis.call('ZADD', grants, records[i + 1], string.format('%016d:%d', after - left, n - left) .. tag)
      n = left
    end
    left = left - n
    if left == 0 then
      break
    end
  end
  redis.call('ZREM', grants, unpack(gone))
end
local newest = redis.call('ZREVRANGEBYSCORE', grants, top, string.format('%d', base), 'WITHSCORES', 'LIMIT', 0, 1)
if #newest > 0 then
  last = tonumber(newest[2]) - base
end
          if back < given then given = back end
        end
        if wrote then
          local value, expire = nil, false
          --[[ more_encode ]] -- Nothing: a further rate's commit and release write its grants log.
          if flat_write then
            parts, moved, kept = (parts or '') .. ';' .. (value or ''), moved or expire, kept or value
          else
            --[[ more_write ]] 
          end
        end
        --[[ more_report ]] remaining = rate - used
if used > 0 then
  reset = (last + interval) * 1000 - NOW_US
end
        if remaining > limit then remaining = limit elseif remaining < 0 then remaining = 0 end
        if remaining < least then
          least = remaining
          if allowed == 1 then bound = i end
        end
        if reset > latest then latest = reset end
        if reset < soonest then soonest = reset end
      end
      remaining, reset, back = least, latest, given
    end
    -- The state's expiry: a step that moved it, or with several rates any
    -- write, has the hash expire when the last rate is full again, and a
    -- flat state is written with its expiry. KEYS[1] holding a stored
    -- config keeps the config's expiry (none, Expire's, or the keep-alive
    -- below); another key never outlives the config (Expire, ExpireAt).
    local cap = stored and keepalive == 0 and (kind == 1 and counted or where ~= KEYS[1] and (expire or rates and wrote))
        and redis.call('PTTL', KEYS[1])
    local ms = (reset + (-reset) % 1000) / 1000
    if ms < 1 then ms = 1 end
    if flat_write and wrote and (parts or rest) then
      -- Several rates' parts: gone when every one is empty, and expiring
      -- when the last rate is full again.
      if not (value or kept or rest and string.find(rest, '[^;]')) then
        redis.call('DEL', KEYS[1])
      else
        value = (value or '') .. (parts or '') .. (rest and ';' .. rest or '')
        if expire or moved then
          redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ms))
        else
          redis.call('SET', KEYS[1], value, 'KEEPTTL')
        end
      end
    elseif flat_write then
      if value and expire then
        redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ms))
      elseif value then
        redis.call('SET', KEYS[1], value, 'KEEPTTL')
      elseif wrote and flat then
        redis.call('DEL', KEYS[1])
      end
    elseif IN_CONFIG and (expire or rates and wrote) and (where ~= KEYS[1] or not stored) then
      if cap and cap > 0 and cap < ms then ms = cap end
      redis.call('PEXPIRE', where, string.format('%d', ms))
    end
    -- The token bucket on a default keeps its state in keys the others never
    -- read: its marker in KEYS[1] (its name, as a string) shows them it is
    -- there, with the GET they do anyway, and expires with the state. It is
    -- written when a step wrote the state (a grant: one command) or finds
    -- it missing (state from before markers), and goes when the state does.
    -- none: no config, and KEYS[1] empty or holding the marker.
    if none and not IN_CONFIG and kind == 0 and (wrote or not marked) then
      if reset > 0 then
        redis.call('SET', KEYS[1], ALGORITHM, 'PX', string.format('%d', ms))
      elseif marked then
        redis.call('DEL', KEYS[1])
      end
    end
    if counted and kind == 1 then
      -- The registry lets Delete, Reset and Expire reach every client's
      -- keys. It lives as long as any client's state can: one interval, or
      -- the time a funnel takes to drain when its burst exceeds its rate,
      -- the longest of any rate's.
      local added = redis.pcall('ZADD', KEYS[REGISTRY], NOW_MS, ARGV[CLIENT_ID])
      if type(added) == 'table' then
        error('REDLIMIT corrupt ' .. KEYS[REGISTRY] .. ': ' .. added.err, 0)
      end
      local life = math.max(interval, burst * interval / rate)
      for j = 1, 4 * n, 4 do
        life = math.max(life, rates[j + 1], rates[j + 2] * rates[j + 1] / rates[j])
      end
      local ms = life + (-life) % 1
      if cap and cap > 0 and cap < ms then ms = cap end
      redis.call('PEXPIRE', KEYS[REGISTRY], ms)
      -- PerClient state is in keys of each algorithm's own (and the
      -- registry, which all share): on a default, a marker in KEYS[1] as the
      -- token bucket's, but for as long as the registry lives. A flat state
      -- of this algorithm's there (an Overall default's) names it already.
      if none then
        redis.call('SET', KEYS[1], ALGORITHM, 'PX', ms)
      end
    end
    if stored and keepalive > 0 and permits > 0 then
      -- Every acquire keeps the config alive, granted or denied: a saturated
      -- limiter is busy, not idle. State in the config hash keeps it alive as
      -- long as the state counts (a funnel whose burst drains slower).
      local ttl = keepalive
      if decide and IN_CONFIG and kind == 0 and reset > ttl * 1000 then
        ttl = (reset + (-reset) % 1000) / 1000
      end
      redis.call('PEXPIRE', KEYS[1], ttl)
    end
    if not decide then
      return back
    end
    -- The reply, declared in call.go (replyHash and what follows it), which
    -- script.go writes here: its kind, then integers in one string (one
    -- value for the client to read, not six). A hash reply: allowed 0 or 1,
    -- limit, remaining, retry after µs (-1: never), reset after µs, window
    -- ms (the span limit applies to: the interval, or the time a funnel's
    -- burst takes to drain), shadow (1: the stored config's limiter is in
    -- shadow mode, and the client grants what this denies). With several rates, limit and window are still
    -- the first rate's, and follow: the index of the rate that bound the
    -- answer (0 for the first) and the further rates as more holds them
    -- (the client works out their limits and windows: formatting them here
    -- would cost every call).
    -- When the handle's default decided ('default …' or 'defer …') and no
    -- hash holds the state, its client knows every limit and window: a
    -- default reply has allowed, remaining, retry, reset, and the bound
    -- with several rates. Its kind also tells the client that its next
    -- decision finds no hash (source default, not defer).
    if not stored and d == 100 and not (IN_CONFIG and f) and not calendar then
      if rates then
        return --[[ reply_default_rates ]] string.format('d %d %d %d %d %d', allowed, remaining, retry, reset, bound)
      end
      return --[[ reply_default ]] string.format('d %d %d %d %d', allowed, remaining, retry, reset)
    end
    local window = limit * interval / rate
    window = window + (-window) % 1
    if rates then
      if calendar then
        -- The further rates as they are now: a calendar window's length.
        local now = {}
        for j = 1, 4 * n do now[j] = string.format('%d', rates[j]) end
        more = table.concat(now, ' ')
      end
      return --[[ reply_hash_rates ]] string.format('h %d %d %d %d %d %d %d %d ', allowed, limit, remaining, retry, reset, window, shadow, bound) .. more
    end
    return --[[ reply_hash ]] string.format('h %d %d %d %d %d %d %d', allowed, limit, remaining, retry, reset, window, shadow)
  end
end

return decide
end

makers['funnel'] = function()
local ALGORITHM, N, IN_CONFIG, RECORDS, BURST, BUCKETS, CALENDAR_RATES = 'funnel', 1, true, false, true, false, false
local REGISTRY, REQUESTS = 2, 3 -- KEYS': the client registry, the request log
-- >>> A batch's script (script.go's batchScript) holds what follows, up to
-- the decision's end, once per algorithm, and runs each request's decision
-- on its own keys and arguments: nothing here may read KEYS or ARGV but
-- the decision, which is given them.
-- A string in KEYS[1] is a flat state or a marker (see the decision), and
-- tells the algorithm that wrote it: a marker is the algorithm's name, and
-- each flat state has its own shape (its encode section), so no tag is
-- needed and state written before markers existed reads as it did: a
-- funnel's holds digits and ',' only, a fixed window's a space, a sliding
-- window's a ':' (';' between rates). FOREIGN matches every string this
-- algorithm did not write and, besides its marker, none it did; the token
-- bucket writes only its marker. admin.lua's attribution names the writer.
local FOREIGN = ALGORITHM == 'funnel' and '[^%d,;]' or ALGORITHM == 'fixed_window' and '^[^ ]*$'
    or ALGORITHM == 'sliding_window' and '^[^:]*$' or ''

--[[ helpers ]] -- times returns m emission intervals of pe + pr / rate µs, as whole µs and a
-- remainder in 1/rate µs. Where m × pr passes 2^52 (doubles are exact to
-- 2^53) it is summed digit by digit of m in base b, a power of 2 small
-- enough that every partial sum stays below 2^52.
local function times(m, pe, pr, rate)
  local x = m * pr
  if x < 4503599627370496 then
    local f = x % rate
    return m * pe + (x - f) / rate, f
  end
  local w, b, top, q, f = m * pe, 1, 1, 0, 0
  while b * 2 * rate <= 2251799813685248 do b = b * 2 end
  while top * b <= m do top = top * b end
  while top >= 1 do
    local digit = (m - m % top) / top
    local y = f * b + digit * pr
    f = y % rate
    m, q, top = m % top, q * b + (y - f) / rate, top / b
  end
  return w + q, f
end

-- count returns how many whole emission intervals fit in w µs plus f / rate
-- µs: floor((w × rate + f) / (pe × rate + pr)), for w ≥ 0 and f < rate.
local function count(w, f, pe, pr, rate)
  if pr == 0 then
    return (w - w % pe) / pe -- f / rate is less than 1µs, pe whole µs
  end
  local period, x = pe * rate + pr, w * rate + f
  if x < 4503599627370496 then
    return (x - x % period) / period
  end
  -- Doubles put the count within a few of the truth; exact steps end it.
  local k = x / period
  k = k - k % 1
  local kw, kf = times(k, pe, pr, rate)
  while kw > w or kw == w and kf > f do
    k, kw, kf = k - 1, kw - pe, kf - pr
    if kf < 0 then kw, kf = kw - 1, kf + rate end
  end
  while true do
    local nw, nf = kw + pe, kf + pr
    if nf >= rate then nw, nf = nw + 1, nf - rate end
    if nw > w or nw == w and nf > f then
      return k
    end
    k, kw, kf = k + 1, nw, nf
  end
end

-- soonest: the last decision's shortest reset, µs, among its rates (reset
-- is the longest): a fixed window's first window to end, where a lease's
-- block must end too; since: when its grant starts to count down, µs, if
-- later than now: a funnel's, queued behind the permits before it (the
-- earliest of its rates'), which a lease's refund names (the lease op
-- below).
local soonest, since = 0, nil

-- The decision (allow) and its inverse (release), on a request's KEYS and
-- ARGV: its reply, or nil for a config that is missing or fails a check
-- here, which goes on to admin.lua, to say what is wrong.
local function decide(KEYS, ARGV)
  -- A batch's requests each carry their clock, or '' for the call's.
  local NOW_US, NOW_MS = NOW_US, NOW_MS
  since = nil
  if ARGV[NOW] ~= '' then
    NOW_US = ARGV[NOW] + 0
    NOW_MS = (NOW_US - NOW_US % 1000) / 1000
  end
  local op, LOG = ARGV[OP], ARGV[LOG_WINDOW] ~= nil and ARGV[LOG_WINDOW] ~= ''
  local rate, interval, kind, burst, buckets, keepalive, stored
  -- shadow: 1 when the stored config's limiter is in shadow mode (SetShadow).
  local shadow = 0
  -- spec: the config's calendar rates (CALENDARS above), or nil; calendar:
  -- their windows' edges, { b0, b1, b2, b3 } by their state fields' K.
  local spec, calendar = nil, nil
  -- K: the suffix of a rate's state fields, '' for the config's own rate.
  local K = ''

  -- A client re-sends a script whose reply it did not read (go-redis does on a
  -- read timeout). Counting it twice only denies sooner, so by default nothing
  -- guards against it. With WithRetryWindow (LOG), the request log remembers
  -- each request id for the window: first_run both checks and records the id,
  -- and is false for a re-run, whose grant is counted already. (The token
  -- bucket's records hold the id of their latest grant too: see its file.)
  local first_run = LOG and function()
    local added = redis.pcall('ZADD', KEYS[REQUESTS], 'NX', NOW_MS + ARGV[LOG_WINDOW], ARGV[ID])
    if type(added) == 'table' then
      error('REDLIMIT corrupt ' .. KEYS[REQUESTS] .. ': ' .. added.err, 0)
    end
    if added == 0 then
      return false
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[REQUESTS], '-inf', NOW_MS)
    redis.call('PEXPIRE', KEYS[REQUESTS], ARGV[LOG_WINDOW])
    return true
  end

  -- KEYS[1] is a hash, or, for an IN_CONFIG algorithm, a flat state: while
  -- no config is stored, the Overall state as a plain string (each rate's
  -- as its encode section writes it), which GET reads and SET … PX writes
  -- at less cost than HMGET, HSET and PEXPIRE. Each read is the likelier
  -- one first, and costs a failed command when wrong: GET for a default
  -- whose last decision found no hash (SOURCE default), HMGET for any
  -- other (defer, a stored config only, fixed); a token bucket's default
  -- only asks whether the hash exists. d and a: ARGV[4]'s first and fourth
  -- bytes, 'd' for either default and 'a' for default.
  -- f: rate, interval, type, keepAliveTime, algorithm, more, shadow, then
  -- burst (BURST) or buckets (BUCKETS), then the state's fields, or nil; flat:
  -- the flat state, or nil; none: KEYS[1] does not exist.
  local d, _, _, a = string.byte(ARGV[CONFIG], 1, 4)
  local f, flat, none, marked = nil, nil, false, false
  if a == 97 then
    local got = redis.pcall('GET', KEYS[1])
    if not got then none = true elseif not got.err then flat = got end
  end
  if not flat and not none then
    f = redis.pcall('HMGET', KEYS[1], 'rate', 'interval', 'type', 'keepAliveTime', 'algorithm', 'more', 'shadow'
      --[[ own_config ]] , 'burst'--[[ fields ]] , 'tat' .. K)
    if not f.err then
      stored = f[1] or f[2] or f[5]
    elseif redis.call('TYPE', KEYS[1]).ok == 'string' then
      flat, f = redis.call('GET', KEYS[1]), nil
    else
      error('REDLIMIT corrupt ' .. KEYS[1] .. ': ' .. f.err, 0)
    end
  end
  -- One algorithm's state is never counted by another: a string another
  -- wrote (see FOREIGN) goes to admin.lua, which names it. This
  -- algorithm's marker says only that its state is elsewhere: none here.
  local foreign = false
  if flat and string.find(flat, FOREIGN) then
    if flat == ALGORITHM then flat, none, marked = nil, true, true else foreign = true end
  end
  local ok, more = not stored and ARGV[CONFIG] ~= '' and not foreign, nil
  local S = (BURST or BUCKETS or CALENDAR_RATES) and 9 or 8 -- the first state field
  -- A default that found a hash with neither config nor state of its own
  -- (its first rate's): a defer sees whether KEYS[1] is there at all, and if
  -- not, writes the state flat, and the short reply sends the handle back
  -- to default; else a hash of another algorithm's fields (as Throttle
  -- leaves a funnel's) goes to admin.lua too. Not on the usual paths.
  if f and not stored and d == 100 and not (IN_CONFIG and (f[S] or f[S + 1])) then
    if IN_CONFIG and a == 101 and redis.call('EXISTS', KEYS[1]) == 0 then
      f, none = nil, true
    else
      local g = redis.call('HMGET', KEYS[1], 'tat', 'window', 'counts')
      ok = ok and not (g[1] or g[2] or g[3]) -- this algorithm's own are empty
    end
  end
  if stored then
    -- The same checks as admin.lua's stored_config, which names the culprit.
    rate, interval, kind, keepalive = tonumber(f[1]), tonumber(f[2]), tonumber(f[3] or 0), tonumber(f[4] or 0)
    burst, buckets = 0, 0
    if BURST then burst = tonumber(f[8] or 0) elseif BUCKETS then buckets = tonumber(f[8] or 0) elseif CALENDAR_RATES and f[8] and f[8] ~= '' then spec = f[8] end
    ok = rate and interval and kind and burst and buckets and keepalive
        and rate % 1 + interval % 1 + kind % 1 + burst % 1 + buckets % 1 + keepalive % 1 == 0
        and rate >= 1 and rate <= (RECORDS and 4294967295 or MAX) and interval >= 1 and interval <= MAX and (kind == 0 or kind == 1)
        and burst >= 0 and burst <= MAX and buckets >= 0 and buckets <= MAX_BUCKETS and keepalive >= 0 and keepalive <= MAX
        and (buckets == 0 and DEFAULT_BUCKETS or buckets) <= interval and rate <= interval * 1000
        and (f[5] or 'tokenbucket') == ALGORITHM
    more = f[6]
    if f[7] == '1' then shadow = 1 end
  end
  -- The handle's config: a default while none is stored, a fixed one
  -- (Throttle's) even over a stored one, which must still be sound. Go
  -- wrote it: a '0' needs no converting.
  if ok and ARGV[CONFIG] ~= '' and (not stored or string.sub(ARGV[CONFIG], 1, 6) == 'fixed ') then
    local parsed = configs and configs[ARGV[CONFIG]]
    if parsed then
      rate, interval, more, kind, burst, buckets, keepalive, spec = unpack(parsed)
    else
      local r, i, options, rest = string.match(ARGV[CONFIG], '^%a+ (%d+) (%d+) (%d+ %d+ %d+ %d+) ?(.*)$')
      spec = nil
      if string.byte(rest, 1) == 64 then -- '@': calendar rates
        spec, rest = string.match(rest, '^@(%S+) ?(.*)$')
      end
      rate, interval, more = r + 0, i + 0, rest
      kind, burst, buckets, keepalive = 0, 0, 0, 0
      if options ~= '0 0 0 0' then -- Overall, no burst, buckets or keep-alive: most defaults
        local t, b, bk, ka = string.match(options, '^(%d+) (%d+) (%d+) (%d+)$')
        kind, burst, buckets, keepalive = t + 0, b + 0, bk + 0, ka + 0
      end
      if configs then
        configs[ARGV[CONFIG]] = { rate, interval, more, kind, burst, buckets, keepalive, spec }
      end
    end
  end
  -- The further rates, n of them: rate, interval, burst, buckets of each,
  -- flat. Each match starts where the last one ended, so the checks cover
  -- every byte.
  local rates, n = nil, 0
  if ok and more and more ~= '' then
    local last = 0
    ok = string.byte(more, -1) ~= 32 -- a space
    while ok and last < #more do
      local _, r, i, b, bk
      _, last, r, i, b, bk = string.find(more, '^(%d+) (%d+) (%d+) (%d+) ?', last + 1)
      if not last or n == MAX_RATES - 1 then
        ok = false
      else
        -- Only a funnel has a burst and only a sliding window buckets: the
        -- others' are '0', and turning a string into a number costs.
        r, i = r + 0, i + 0
        if b == '0' then b = r else b = b + 0 end
        if bk == '0' then bk = DEFAULT_BUCKETS else bk = bk + 0 end
        ok = r >= 1 and r <= i * 1000 and i <= MAX and b <= MAX and bk <= MAX_BUCKETS and bk <= i
        if rates then
          local j = 4 * n
          rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4] = r, i, b, bk
        else
          rates = { r, i, b, bk } -- built whole: one further rate is the usual
        end
        n = n + 1
      end
    end
  end
  if ok and kind == 1 and not KEYS[REGISTRY] then
    return 'perclient' -- sent with the short key list: see KEYS above
  end
  -- Calendar rates count in windows whose edges Go sent (ARGV[CALENDAR]);
  -- a request that sent none, or another config's, is told which to send.
  ok = ok and (not spec or CALENDAR_RATES)
  if ok and spec then
    local given, edges = string.match(ARGV[CALENDAR] or '', '^(%S+) (.*)$')
    if given ~= spec then
      return 'calendar ' .. spec
    end
    local list, at = {}, 0
    for edge in string.gmatch(edges, '%d+') do list[#list + 1] = edge + 0 end
    calendar = {}
    for place in string.gmatch(spec, '(%d+)=') do
      ok = ok and place + 0 <= n + 1 -- a rate of the config's (admin.lua names one that is not)
      calendar[RATE_SUFFIX[place + 0] or ''] = { list[at + 1], list[at + 2], list[at + 3], list[at + 4] }
      at = at + 4
    end
  end
  if ok then
    if burst == 0 then burst = rate end
    if buckets == 0 then buckets = DEFAULT_BUCKETS end
    -- A flat state holds each rate's part, ';' between them; rest: the
    -- parts after the one read, kept for the further rates (and, beyond
    -- this handle's, for another handle's default that has more).
    local where, s1, s2, rest = KEYS[1], nil, nil, nil
    if f then
      s1, s2 = f[S], f[S + 1]
    elseif flat then
      local cut = string.find(flat, ';', 1, true)
      if cut then -- not one assignment: gopher-lua (miniredis) assigns flat before it reads it again
        rest = string.sub(flat, cut + 1)
        flat = string.sub(flat, 1, cut - 1)
      end
      if flat ~= '' then
        --[[ decode ]] s1 = flat
      end
    end
    -- The state is written flat when it can be: see above.
    local flat_write = IN_CONFIG and not f and kind == 0
    if IN_CONFIG and kind == 1 then
      where = KEYS[REQUESTS + 1]
      local g = redis.pcall('HMGET', where--[[ fields ]] , 'tat' .. K)
      if g.err then error('REDLIMIT corrupt ' .. where .. ': ' .. g.err, 0) end
      s1, s2 = g[1], g[2]
    end
    -- charge: a grant whatever the limit says (Limiter.Charge), counted as
    -- any grant, so that what it takes past the limit is a debt the next
    -- requests wait out.
    local charge = op == 'charge'
    -- grant_at and grant_size: a refund's grant, its time in µs on Redis's
    -- clock and its permits (PERMITS is 'permits since granted': a lease
    -- giving back what it did not use of a block), so that each rate's
    -- release gives back only what is still counted of that grant, and
    -- never what later grants or time have made another's.
    local permits, grant_at, grant_size, decide = ARGV[PERMITS], nil, nil, op == 'allow' or charge
    if op == 'refund' then
      local n, t, g = string.match(permits, '^(%d+) (%d+) (%d+)$')
      if not n or n + 0 > g + 0 then
        error('REDLIMIT refund ' .. string.format('%q', permits) .. ': want "permits since-µs granted"', 0)
      end
      permits, grant_at, grant_size = n + 0, t + 0, g + 0
    else
      permits = permits + 0
    end
    local allowed, retry, wait, remaining, reset, bound, back = 0, 0, 0, 0, 0, 0, 0
    -- expire: a step wrote state whose expiry must move (IN_CONFIG), and
    -- then writes every field; wrote: a step wrote anything; rewrite: the
    -- state read must be written though nothing was counted (the token
    -- bucket's cache, found wrong); value: the state as encode left it.
    local expire, wrote, rewrite, value = false, false, false, nil
    --[[ load ]] -- The emission interval is pe + pr / rate µs, and the tolerance, burst of
-- them, tolerance + tf / rate µs. The stored TAT (tat + tatf / rate µs) is
-- clamped to now at the earliest, and to a full funnel at the latest (the
-- usage a rate decrease leaves behind fits the new capacity), unless it is
-- owed: a charge's debt drains, to the µs, before anything more is granted.
-- Below 2^52, m × pr is exact and so are the steps from it (the common
-- case, written out here as in wait and commit); times takes the rest.
local pe = interval * 1000 / rate
pe = pe - pe % 1
local pr = interval * 1000 - pe * rate
local tolerance, tf = burst * pe, burst * pr
if tf < 4503599627370496 then
  local f = tf % rate
  tolerance, tf = tolerance + (tf - f) / rate, f
else
  tolerance, tf = times(burst, pe, pr, rate)
end
local tat, tatf = NOW_US, 0
if s1 then
  local t, f, owed = string.match(s1, '^(%d+),?(%d*),?(1?)$')
  tat = t and t + 0
  if not tat or tat > MAX then
    error('REDLIMIT corrupt ' .. where .. ': field tat' .. K .. ' = ' .. string.format('%q', s1), 0)
  end
  if f ~= '' then
    tatf = f + 0
    if tatf >= rate then tat, tatf = tat + 1, 0 end
  end
  if tat < NOW_US then
    tat, tatf = NOW_US, 0
  elseif (tat - NOW_US > tolerance or tat - NOW_US == tolerance and tatf > tf) and owed == '' then
    tat, tatf = NOW_US + tolerance, tf
  end
end
    local limit = --[[ capacity ]] burst
    if decide then
      if permits > limit and not charge then
        retry = -1
      else
        --[[ wait ]] -- Permits fit when tat + permits × emission ≤ now + tolerance: the wait is
-- the exact difference, rounded up to whole µs.
local w, f = (burst - permits) * pe, (burst - permits) * pr
if f < 4503599627370496 then
  local r = f % rate
  w, f = w + (f - r) / rate, r
else
  w, f = times(burst - permits, pe, pr, rate)
end
wait = tat - NOW_US - w
if tatf > f then wait = wait + 1 end
      end
    end
    -- The further rates are read before anything is written: each one's
    -- state goes into states, for its steps after the decision, and a
    -- decision weighs its wait. Every rate must allow: a denial is bound by
    -- the longest wait, or by the first rate that can never grant so many.
    local states, longest
    if rates then
      states, longest = { nil, nil }, 0 -- sized for one further rate, the usual
      local most = wait
      for i = 1, n do
        local j, K = 4 * i - 4, RATE_SUFFIX[i + 1]
        local rate, interval, burst, buckets = rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4]
        if interval > longest then longest = interval end
        local s1, s2
        if IN_CONFIG and (f or where ~= KEYS[1]) then
          local g = redis.pcall('HMGET', where--[[ fields ]] , 'tat' .. K)
          if g.err then error('REDLIMIT corrupt ' .. where .. ': ' .. g.err, 0) end
          s1, s2 = g[1], g[2]
        elseif rest then
          local flat, cut = rest, string.find(rest, ';', 1, true)
          rest = nil
          if cut then
            rest = string.sub(flat, cut + 1)
            flat = string.sub(flat, 1, cut - 1)
          end
          if flat ~= '' then
            --[[ more_decode ]] s1 = flat
          end
        end
        --[[ more_load ]] -- The emission interval is pe + pr / rate µs, and the tolerance, burst of
-- them, tolerance + tf / rate µs. The stored TAT (tat + tatf / rate µs) is
-- clamped to now at the earliest, and to a full funnel at the latest (the
-- usage a rate decrease leaves behind fits the new capacity), unless it is
-- owed: a charge's debt drains, to the µs, before anything more is granted.
-- Below 2^52, m × pr is exact and so are the steps from it (the common
-- case, written out here as in wait and commit); times takes the rest.
local pe = interval * 1000 / rate
pe = pe - pe % 1
local pr = interval * 1000 - pe * rate
local tolerance, tf = burst * pe, burst * pr
if tf < 4503599627370496 then
  local f = tf % rate
  tolerance, tf = tolerance + (tf - f) / rate, f
else
  tolerance, tf = times(burst, pe, pr, rate)
end
local tat, tatf = NOW_US, 0
if s1 then
  local t, f, owed = string.match(s1, '^(%d+),?(%d*),?(1?)$')
  tat = t and t + 0
  if not tat or tat > MAX then
    error('REDLIMIT corrupt ' .. where .. ': field tat' .. K .. ' = ' .. string.format('%q', s1), 0)
  end
  if f ~= '' then
    tatf = f + 0
    if tatf >= rate then tat, tatf = tat + 1, 0 end
  end
  if tat < NOW_US then
    tat, tatf = NOW_US, 0
  elseif (tat - NOW_US > tolerance or tat - NOW_US == tolerance and tatf > tf) and owed == '' then
    tat, tatf = NOW_US + tolerance, tf
  end
end
        if calendar then rates[j + 2] = interval end -- a calendar window's own length (load)
        states[2 * i - 1], states[2 * i] = s1, s2
        local limit = --[[ capacity ]] burst
        if decide and retry ~= -1 then
          if permits > limit and not charge then
            retry, bound = -1, i
          else
            local wait = 0
            --[[ more_wait ]] -- Permits fit when tat + permits × emission ≤ now + tolerance: the wait is
-- the exact difference, rounded up to whole µs.
local w, f = (burst - permits) * pe, (burst - permits) * pr
if f < 4503599627370496 then
  local r = f % rate
  w, f = w + (f - r) / rate, r
else
  w, f = times(burst - permits, pe, pr, rate)
end
wait = tat - NOW_US - w
if tatf > f then wait = wait + 1 end
            if wait > most then
              most = wait
              if wait > 0 then bound = i end -- a grant is bound by what it leaves
            end
          end
        end
      end
      wait = most
    end
    if charge then
      wait = 0
    end
    local counted = false
    if decide and retry ~= -1 then
      -- Zero permits is a peek: it writes nothing.
      if wait <= 0 then
        allowed = 1
        if permits > 0 and (not LOG or first_run()) then
          counted = true
          --[[ commit ]] -- The grant drains from the TAT before it (whole µs, rounded down): a
-- refund reckons from there (common.lua's since).
if not since or tat < since then since = tat end
local w, f = permits * pe, permits * pr
if f < 4503599627370496 then
  local r = f % rate
  w, f = w + (f - r) / rate, r
else
  w, f = times(permits, pe, pr, rate)
end
tat, tatf = tat + w, tatf + f
if tatf >= rate then tat, tatf = tat + 1, tatf - rate end
          wrote = counted
        end
      elseif permits > 0 and (--[[ resent ]] false or LOG and redis.call('ZSCORE', KEYS[REQUESTS], ARGV[ID])) then
        allowed = 1 -- a re-sent script whose first run was granted
      else
        retry = wait
      end
    elseif op == 'refund' and redis.call('ZREM', KEYS[REQUESTS], ARGV[ID]) == 1
        or op ~= 'refund' and not decide and (not LOG or first_run()) then
      -- A refund names its take's id, which the take left in the request
      -- log: it gives back once, and nothing after whatever forgot the log
      -- (Reset, Delete, a change of rates: the state its grant was counted
      -- in is gone, or counts otherwise).
      wrote = true
      --[[ release ]] back = count(tat - NOW_US, tatf, pe, pr, rate)
if back > permits then back = permits end
if grant_at then
  -- A refund gives back only what has not drained of its grant:
  -- grant_at + grant_size × emission − now, in whole emission intervals. Whatever came
  -- between, the TAT is then no lower than without those permits.
  local w, f = times(grant_size, pe, pr, rate)
  w = w + grant_at - NOW_US
  local left = w >= 0 and count(w, f, pe, pr, rate) or 0
  if left < back then back = left end
end
local w, f = times(back, pe, pr, rate)
tat, tatf = tat - w, tatf - f
if tatf < 0 then tat, tatf = tat - 1, tatf + rate end
    end
    -- What a commit or release left (or a state to rewrite), written as
    -- fields; a flat state is written below, with its expiry.
    if wrote or rewrite then
      --[[ encode ]] -- An empty funnel has no state; every other moves its expiry. A TAT past a
-- full funnel is a charge's debt (see the top).
value = nil
if tat - NOW_US > tolerance or tat - NOW_US == tolerance and tatf > tf then
  value = string.format('%d,%d,1', tat, tatf)
elseif tatf > 0 then
  value = string.format('%d,%d', tat, tatf)
elseif tat > NOW_US then
  value = string.format('%d', tat)
end
expire = value ~= nil
      if not flat_write then
        --[[ write ]] if value then
  redis.call('HSET', where, 'tat' .. K, value)
else
  redis.call('HDEL', where, 'tat' .. K)
end
      end
    end
    --[[ report ]] -- Until the funnel is empty, rounded up; and the permits that fit now: the
-- whole emission intervals in tolerance − (TAT − now), never below 0.
reset = tat - NOW_US
do
  local w, f = tolerance - reset, tf - tatf
  if f < 0 then w, f = w - 1, f + rate end
  local x = w * rate + f
  if x < 0 then
    remaining = 0
  elseif x < 4503599627370496 then
    remaining = (x - x % (interval * 1000)) / (interval * 1000) -- count's common case
  else
    remaining = count(w, f, pe, pr, rate)
  end
end
if tatf > 0 then reset = reset + 1 end
    if remaining > limit then remaining = limit elseif remaining < 0 then remaining = 0 end
    soonest = reset
    -- The further rates' steps, each from the state read before: a grant
    -- counts in every one, a release gives back in every one, and the answer
    -- is the smallest remaining and the longest reset.
    -- parts: the further rates' parts of a flat state, each after a ';';
    -- moved: the expiry of one of them moves; kept: one of them is not empty.
    local parts, moved, kept
    if rates then
      local least, latest, given = remaining, reset, back
      for i = 1, n do
        local j, K = 4 * i - 4, RATE_SUFFIX[i + 1]
        local rate, interval, burst, buckets = rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4]
        local s1, s2 = states[2 * i - 1], states[2 * i]
        --[[ more_load ]] -- The emission interval is pe + pr / rate µs, and the tolerance, burst of
-- them, tolerance + tf / rate µs. The stored TAT (tat + tatf / rate µs) is
-- clamped to now at the earliest, and to a full funnel at the latest (the
-- usage a rate decrease leaves behind fits the new capacity), unless it is
-- owed: a charge's debt drains, to the µs, before anything more is granted.
-- Below 2^52, m × pr is exact and so are the steps from it (the common
-- case, written out here as in wait and commit); times takes the rest.
local pe = interval * 1000 / rate
pe = pe - pe % 1
local pr = interval * 1000 - pe * rate
local tolerance, tf = burst * pe, burst * pr
if tf < 4503599627370496 then
  local f = tf % rate
  tolerance, tf = tolerance + (tf - f) / rate, f
else
  tolerance, tf = times(burst, pe, pr, rate)
end
local tat, tatf = NOW_US, 0
if s1 then
  local t, f, owed = string.match(s1, '^(%d+),?(%d*),?(1?)$')
  tat = t and t + 0
  if not tat or tat > MAX then
    error('REDLIMIT corrupt ' .. where .. ': field tat' .. K .. ' = ' .. string.format('%q', s1), 0)
  end
  if f ~= '' then
    tatf = f + 0
    if tatf >= rate then tat, tatf = tat + 1, 0 end
  end
  if tat < NOW_US then
    tat, tatf = NOW_US, 0
  elseif (tat - NOW_US > tolerance or tat - NOW_US == tolerance and tatf > tf) and owed == '' then
    tat, tatf = NOW_US + tolerance, tf
  end
end
        local limit = --[[ capacity ]] burst
        local remaining, reset, back = 0, 0, 0
        if counted then
          --[[ more_commit ]] -- The grant drains from the TAT before it (whole µs, rounded down): a
-- refund reckons from there (common.lua's since).
if not since or tat < since then since = tat end
local w, f = permits * pe, permits * pr
if f < 4503599627370496 then
  local r = f % rate
  w, f = w + (f - r) / rate, r
else
  w, f = times(permits, pe, pr, rate)
end
tat, tatf = tat + w, tatf + f
if tatf >= rate then tat, tatf = tat + 1, tatf - rate end
        elseif wrote then
          --[[ more_release ]] back = count(tat - NOW_US, tatf, pe, pr, rate)
if back > permits then back = permits end
if grant_at then
  -- A refund gives back only what has not drained of its grant:
  -- grant_at + grant_size × emission − now, in whole emission intervals. Whatever came
  -- between, the TAT is then no lower than without those permits.
  local w, f = times(grant_size, pe, pr, rate)
  w = w + grant_at - NOW_US
  local left = w >= 0 and count(w, f, pe, pr, rate) or 0
  if left < back then back = left end
end
local w, f = times(back, pe, pr, rate)
tat, tatf = tat - w, tatf - f
if tatf < 0 then tat, tatf = tat - 1, tatf + rate end
          if back < given then given = back end
        end
        if wrote then
          local value, expire = nil, false
          --[[ more_encode ]] -- An empty funnel has no state; every other moves its expiry. A TAT past a
-- full funnel is a charge's debt (see the top).
value = nil
if tat - NOW_US > tolerance or tat - NOW_US == tolerance and tatf > tf then
  value = string.format('%d,%d,1', tat, tatf)
elseif tatf > 0 then
  value = string.format('%d,%d', tat, tatf)
elseif tat > NOW_US then
  value = string.format('%d', tat)
end
expire = value ~= nil
          if flat_write then
            parts, moved, kept = (parts or '') .. ';' .. (value or ''), moved or expire, kept or value
          else
            --[[ more_write ]] if value then
  redis.call('HSET', where, 'tat' .. K, value)
else
  redis.call('HDEL', where, 'tat' .. K)
end
          end
        end
        --[[ more_report ]] -- Until the funnel is empty, rounded up; and the permits that fit now: the
-- whole emission intervals in tolerance − (TAT − now), never below 0.
reset = tat - NOW_US
do
  local w, f = tolerance - reset, tf - tatf
  if f < 0 then w, f = w - 1, f + rate end
  local x = w * rate + f
  if x < 0 then
    remaining = 0
  elseif x < 4503599627370496 then
    remaining = (x - x % (interval * 1000)) / (interval * 1000) -- count's common case
  else
    remaining = count(w, f, pe, pr, rate)
  end
end
if tatf > 0 then reset = reset + 1 end
        if remaining > limit then remaining = limit elseif remaining < 0 then remaining = 0 end
        if remaining < least then
          least = remaining
          if allowed == 1 then bound = i end
        end
        if reset > latest then latest = reset end
        if reset < soonest then soonest = reset end
      end
      remaining, reset, back = least, latest, given
    end
    -- The state's expiry: a step that moved it, or with several rates any
    -- write, has the hash expire when the last rate is full again, and a
    -- flat state is written with its expiry. KEYS[1] holding a stored
    -- config keeps the config's expiry (none, Expire's, or the keep-alive
    -- below); another key never outlives the config (Expire, ExpireAt).
    local cap = stored and keepalive == 0 and (kind == 1 and counted or where ~= KEYS[1] and (expire or rates and wrote))
        and redis.call('PTTL', KEYS[1])
    local ms = (reset + (-reset) % 1000) / 1000
    if ms < 1 then ms = 1 end
    if flat_write and wrote and (parts or rest) then
      -- Several rates' parts: gone when every one is empty, and expiring
      -- when the last rate is full again.
      if not (value or kept or rest and string.find(rest, '[^;]')) then
        redis.call('DEL', KEYS[1])
      else
        value = (value or '') .. (parts or '') .. (rest and ';' .. rest or '')
        if expire or moved then
          redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ms))
        else
          redis.call('SET', KEYS[1], value, 'KEEPTTL')
        end
      end
    elseif flat_write then
      if value and expire then
        redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ms))
      elseif value then
        redis.call('SET', KEYS[1], value, 'KEEPTTL')
      elseif wrote and flat then
        redis.call('DEL', KEYS[1])
      end
    elseif IN_CONFIG and (expire or rates and wrote) and (where ~= KEYS[1] or not stored) then
      if cap and cap > 0 and cap < ms then ms = cap end
      redis.call('PEXPIRE', where, string.format('%d', ms))
    end
    -- The token bucket on a default keeps its state in keys the others never
    -- read: its marker in KEYS[1] (its name, as a string) shows them it is
    -- there, with the GET they do anyway, and expires with the state. It is
    -- written when a step wrote the state (a grant: one command) or finds
    -- it missing (state from before markers), and goes when the state does.
    -- none: no config, and KEYS[1] empty or holding the marker.
    if none and not IN_CONFIG and kind == 0 and (wrote or not marked) then
      if reset > 0 then
        redis.call('SET', KEYS[1], ALGORITHM, 'PX', string.format('%d', ms))
      elseif marked then
        redis.call('DEL', KEYS[1])
      end
    end
    if counted and kind == 1 then
      -- The registry lets Delete, Reset and Expire reach every client's
      -- keys. It lives as long as any client's state can: one interval, or
      -- the time a funnel takes to drain when its burst exceeds its rate,
      -- the longest of any rate's.
      local added = redis.pcall('ZADD', KEYS[REGISTRY], NOW_MS, ARGV[CLIENT_ID])
      if type(added) == 'table' then
        error('REDLIMIT corrupt ' .. KEYS[REGISTRY] .. ': ' .. added.err, 0)
      end
      local life = math.max(interval, burst * interval / rate)
      for j = 1, 4 * n, 4 do
        life = math.max(life, rates[j + 1], rates[j + 2] * rates[j + 1] / rates[j])
      end
      local ms = life + (-life) % 1
      if cap and cap > 0 and cap < ms then ms = cap end
      redis.call('PEXPIRE', KEYS[REGISTRY], ms)
      -- PerClient state is in keys of each algorithm's own (and the
      -- registry, which all share): on a default, a marker in KEYS[1] as the
      -- token bucket's, but for as long as the registry lives. A flat state
      -- of this algorithm's there (an Overall default's) names it already.
      if none then
        redis.call('SET', KEYS[1], ALGORITHM, 'PX', ms)
      end
    end
    if stored and keepalive > 0 and permits > 0 then
      -- Every acquire keeps the config alive, granted or denied: a saturated
      -- limiter is busy, not idle. State in the config hash keeps it alive as
      -- long as the state counts (a funnel whose burst drains slower).
      local ttl = keepalive
      if decide and IN_CONFIG and kind == 0 and reset > ttl * 1000 then
        ttl = (reset + (-reset) % 1000) / 1000
      end
      redis.call('PEXPIRE', KEYS[1], ttl)
    end
    if not decide then
      return back
    end
    -- The reply, declared in call.go (replyHash and what follows it), which
    -- script.go writes here: its kind, then integers in one string (one
    -- value for the client to read, not six). A hash reply: allowed 0 or 1,
    -- limit, remaining, retry after µs (-1: never), reset after µs, window
    -- ms (the span limit applies to: the interval, or the time a funnel's
    -- burst takes to drain), shadow (1: the stored config's limiter is in
    -- shadow mode, and the client grants what this denies). With several rates, limit and window are still
    -- the first rate's, and follow: the index of the rate that bound the
    -- answer (0 for the first) and the further rates as more holds them
    -- (the client works out their limits and windows: formatting them here
    -- would cost every call).
    -- When the handle's default decided ('default …' or 'defer …') and no
    -- hash holds the state, its client knows every limit and window: a
    -- default reply has allowed, remaining, retry, reset, and the bound
    -- with several rates. Its kind also tells the client that its next
    -- decision finds no hash (source default, not defer).
    if not stored and d == 100 and not (IN_CONFIG and f) and not calendar then
      if rates then
        return --[[ reply_default_rates ]] string.format('d %d %d %d %d %d', allowed, remaining, retry, reset, bound)
      end
      return --[[ reply_default ]] string.format('d %d %d %d %d', allowed, remaining, retry, reset)
    end
    local window = limit * interval / rate
    window = window + (-window) % 1
    if rates then
      if calendar then
        -- The further rates as they are now: a calendar window's length.
        local now = {}
        for j = 1, 4 * n do now[j] = string.format('%d', rates[j]) end
        more = table.concat(now, ' ')
      end
      return --[[ reply_hash_rates ]] string.format('h %d %d %d %d %d %d %d %d ', allowed, limit, remaining, retry, reset, window, shadow, bound) .. more
    end
    return --[[ reply_hash ]] string.format('h %d %d %d %d %d %d %d', allowed, limit, remaining, retry, reset, window, shadow)
  end
end

return decide
end

makers['fixed_window'] = function()
local ALGORITHM, N, IN_CONFIG, RECORDS, BURST, BUCKETS, CALENDAR_RATES = 'fixed_window', 1, true, false, false, false, true
local REGISTRY, REQUESTS = 2, 3 -- KEYS': the client registry, the request log
-- >>> A batch's script (script.go's batchScript) holds what follows, up to
-- the decision's end, once per algorithm, and runs each request's decision
-- on its own keys and arguments: nothing here may read KEYS or ARGV but
-- the decision, which is given them.
-- A string in KEYS[1] is a flat state or a marker (see the decision), and
-- tells the algorithm that wrote it: a marker is the algorithm's name, and
-- each flat state has its own shape (its encode section), so no tag is
-- needed and state written before markers existed reads as it did: a
-- funnel's holds digits and ',' only, a fixed window's a space, a sliding
-- window's a ':' (';' between rates). FOREIGN matches every string this
-- algorithm did not write and, besides its marker, none it did; the token
-- bucket writes only its marker. admin.lua's attribution names the writer.
local FOREIGN = ALGORITHM == 'funnel' and '[^%d,;]' or ALGORITHM == 'fixed_window' and '^[^ ]*$'
    or ALGORITHM == 'sliding_window' and '^[^:]*$' or ''

--[[ helpers ]] 

-- soonest: the last decision's shortest reset, µs, among its rates (reset
-- is the longest): a fixed window's first window to end, where a lease's
-- block must end too; since: when its grant starts to count down, µs, if
-- later than now: a funnel's, queued behind the permits before it (the
-- earliest of its rates'), which a lease's refund names (the lease op
-- below).
local soonest, since = 0, nil

-- The decision (allow) and its inverse (release), on a request's KEYS and
-- ARGV: its reply, or nil for a config that is missing or fails a check
-- here, which goes on to admin.lua, to say what is wrong.
local function decide(KEYS, ARGV)
  -- A batch's requests each carry their clock, or '' for the call's.
  local NOW_US, NOW_MS = NOW_US, NOW_MS
  since = nil
  if ARGV[NOW] ~= '' then
    NOW_US = ARGV[NOW] + 0
    NOW_MS = (NOW_US - NOW_US % 1000) / 1000
  end
  local op, LOG = ARGV[OP], ARGV[LOG_WINDOW] ~= nil and ARGV[LOG_WINDOW] ~= ''
  local rate, interval, kind, burst, buckets, keepalive, stored
  -- shadow: 1 when the stored config's limiter is in shadow mode (SetShadow).
  local shadow = 0
  -- spec: the config's calendar rates (CALENDARS above), or nil; calendar:
  -- their windows' edges, { b0, b1, b2, b3 } by their state fields' K.
  local spec, calendar = nil, nil
  -- K: the suffix of a rate's state fields, '' for the config's own rate.
  local K = ''

  -- A client re-sends a script whose reply it did not read (go-redis does on a
  -- read timeout). Counting it twice only denies sooner, so by default nothing
  -- guards against it. With WithRetryWindow (LOG), the request log remembers
  -- each request id for the window: first_run both checks and records the id,
  -- and is false for a re-run, whose grant is counted already. (The token
  -- bucket's records hold the id of their latest grant too: see its file.)
  local first_run = LOG and function()
    local added = redis.pcall('ZADD', KEYS[REQUESTS], 'NX', NOW_MS + ARGV[LOG_WINDOW], ARGV[ID])
    if type(added) == 'table' then
      error('REDLIMIT corrupt ' .. KEYS[REQUESTS] .. ': ' .. added.err, 0)
    end
    if added == 0 then
      return false
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[REQUESTS], '-inf', NOW_MS)
    redis.call('PEXPIRE', KEYS[REQUESTS], ARGV[LOG_WINDOW])
    return true
  end

  -- KEYS[1] is a hash, or, for an IN_CONFIG algorithm, a flat state: while
  -- no config is stored, the Overall state as a plain string (each rate's
  -- as its encode section writes it), which GET reads and SET … PX writes
  -- at less cost than HMGET, HSET and PEXPIRE. Each read is the likelier
  -- one first, and costs a failed command when wrong: GET for a default
  -- whose last decision found no hash (SOURCE default), HMGET for any
  -- other (defer, a stored config only, fixed); a token bucket's default
  -- only asks whether the hash exists. d and a: ARGV[4]'s first and fourth
  -- bytes, 'd' for either default and 'a' for default.
  -- f: rate, interval, type, keepAliveTime, algorithm, more, shadow, then
  -- burst (BURST) or buckets (BUCKETS), then the state's fields, or nil; flat:
  -- the flat state, or nil; none: KEYS[1] does not exist.
  local d, _, _, a = string.byte(ARGV[CONFIG], 1, 4)
  local f, flat, none, marked = nil, nil, false, false
  if a == 97 then
    local got = redis.pcall('GET', KEYS[1])
    if not got then none = true elseif not got.err then flat = got end
  end
  if not flat and not none then
    f = redis.pcall('HMGET', KEYS[1], 'rate', 'interval', 'type', 'keepAliveTime', 'algorithm', 'more', 'shadow'
      --[[ own_config ]] , 'calendar'--[[ fields ]] , 'window' .. K, 'count' .. K)
    if not f.err then
      stored = f[1] or f[2] or f[5]
    elseif redis.call('TYPE', KEYS[1]).ok == 'string' then
      flat, f = redis.call('GET', KEYS[1]), nil
    else
      error('REDLIMIT corrupt ' .. KEYS[1] .. ': ' .. f.err, 0)
    end
  end
  -- One algorithm's state is never counted by another: a string another
  -- wrote (see FOREIGN) goes to admin.lua, which names it. This
  -- algorithm's marker says only that its state is elsewhere: none here.
  local foreign = false
  if flat and string.find(flat, FOREIGN) then
    if flat == ALGORITHM then flat, none, marked = nil, true, true else foreign = true end
  end
  local ok, more = not stored and ARGV[CONFIG] ~= '' and not foreign, nil
  local S = (BURST or BUCKETS or CALENDAR_RATES) and 9 or 8 -- the first state field
  -- A default that found a hash with neither config nor state of its own
  -- (its first rate's): a defer sees whether KEYS[1] is there at all, and if
  -- not, writes the state flat, and the short reply sends the handle back
  -- to default; else a hash of another algorithm's fields (as Throttle
  -- leaves a funnel's) goes to admin.lua too. Not on the usual paths.
  if f and not stored and d == 100 and not (IN_CONFIG and (f[S] or f[S + 1])) then
    if IN_CONFIG and a == 101 and redis.call('EXISTS', KEYS[1]) == 0 then
      f, none = nil, true
    else
      local g = redis.call('HMGET', KEYS[1], 'tat', 'window', 'counts')
      ok = ok and not (g[1] or g[2] or g[3]) -- this algorithm's own are empty
    end
  end
  if stored then
    -- The same checks as admin.lua's stored_config, which names the culprit.
    rate, interval, kind, keepalive = tonumber(f[1]), tonumber(f[2]), tonumber(f[3] or 0), tonumber(f[4] or 0)
    burst, buckets = 0, 0
    if BURST then burst = tonumber(f[8] or 0) elseif BUCKETS then buckets = tonumber(f[8] or 0) elseif CALENDAR_RATES and f[8] and f[8] ~= '' then spec = f[8] end
    ok = rate and interval and kind and burst and buckets and keepalive
        and rate % 1 + interval % 1 + kind % 1 + burst % 1 + buckets % 1 + keepalive % 1 == 0
        and rate >= 1 and rate <= (RECORDS and 4294967295 or MAX) and interval >= 1 and interval <= MAX and (kind == 0 or kind == 1)
        and burst >= 0 and burst <= MAX and buckets >= 0 and buckets <= MAX_BUCKETS and keepalive >= 0 and keepalive <= MAX
        and (buckets == 0 and DEFAULT_BUCKETS or buckets) <= interval and rate <= interval * 1000
        and (f[5] or 'tokenbucket') == ALGORITHM
    more = f[6]
    if f[7] == '1' then shadow = 1 end
  end
  -- The handle's config: a default while none is stored, a fixed one
  -- (Throttle's) even over a stored one, which must still be sound. Go
  -- wrote it: a '0' needs no converting.
  if ok and ARGV[CONFIG] ~= '' and (not stored or string.sub(ARGV[CONFIG], 1, 6) == 'fixed ') then
    local parsed = configs and configs[ARGV[CONFIG]]
    if parsed then
      rate, interval, more, kind, burst, buckets, keepalive, spec = unpack(parsed)
    else
      local r, i, options, rest = string.match(ARGV[CONFIG], '^%a+ (%d+) (%d+) (%d+ %d+ %d+ %d+) ?(.*)$')
      spec = nil
      if string.byte(rest, 1) == 64 then -- '@': calendar rates
        spec, rest = string.match(rest, '^@(%S+) ?(.*)$')
      end
      rate, interval, more = r + 0, i + 0, rest
      kind, burst, buckets, keepalive = 0, 0, 0, 0
      if options ~= '0 0 0 0' then -- Overall, no burst, buckets or keep-alive: most defaults
        local t, b, bk, ka = string.match(options, '^(%d+) (%d+) (%d+) (%d+)$')
        kind, burst, buckets, keepalive = t + 0, b + 0, bk + 0, ka + 0
      end
      if configs then
        configs[ARGV[CONFIG]] = { rate, interval, more, kind, burst, buckets, keepalive, spec }
      end
    end
  end
  -- The further rates, n of them: rate, interval, burst, buckets of each,
  -- flat. Each match starts where the last one ended, so the checks cover
  -- every byte.
  local rates, n = nil, 0
  if ok and more and more ~= '' then
    local last = 0
    ok = string.byte(more, -1) ~= 32 -- a space
    while ok and last < #more do
      local _, r, i, b, bk
      _, last, r, i, b, bk = string.find(more, '^(%d+) (%d+) (%d+) (%d+) ?', last + 1)
      if not last or n == MAX_RATES - 1 then
        ok = false
      else
        -- Only a funnel has a burst and only a sliding window buckets: the
        -- others' are '0', and turning a string into a number costs.
        r, i = r + 0, i + 0
        if b == '0' then b = r else b = b + 0 end
        if bk == '0' then bk = DEFAULT_BUCKETS else bk = bk + 0 end
        ok = r >= 1 and r <= i * 1000 and i <= MAX and b <= MAX and bk <= MAX_BUCKETS and bk <= i
        if rates then
          local j = 4 * n
          rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4] = r, i, b, bk
        else
          rates = { r, i, b, bk } -- built whole: one further rate is the usual
        end
        n = n + 1
      end
    end
  end
  if ok and kind == 1 and not KEYS[REGISTRY] then
    return 'perclient' -- sent with the short key list: see KEYS above
  end
  -- Calendar rates count in windows whose edges Go sent (ARGV[CALENDAR]);
  -- a request that sent none, or another config's, is told which to send.
  ok = ok and (not spec or CALENDAR_RATES)
  if ok and spec then
    local given, edges = string.match(ARGV[CALENDAR] or '', '^(%S+) (.*)$')
    if given ~= spec then
      return 'calendar ' .. spec
    end
    local list, at = {}, 0
    for edge in string.gmatch(edges, '%d+') do list[#list + 1] = edge + 0 end
    calendar = {}
    for place in string.gmatch(spec, '(%d+)=') do
      ok = ok and place + 0 <= n + 1 -- a rate of the config's (admin.lua names one that is not)
      calendar[RATE_SUFFIX[place + 0] or ''] = { list[at + 1], list[at + 2], list[at + 3], list[at + 4] }
      at = at + 4
    end
  end
  if ok then
    if burst == 0 then burst = rate end
    if buckets == 0 then buckets = DEFAULT_BUCKETS end
    -- A flat state holds each rate's part, ';' between them; rest: the
    -- parts after the one read, kept for the further rates (and, beyond
    -- this handle's, for another handle's default that has more).
    local where, s1, s2, rest = KEYS[1], nil, nil, nil
    if f then
      s1, s2 = f[S], f[S + 1]
    elseif flat then
      local cut = string.find(flat, ';', 1, true)
      if cut then -- not one assignment: gopher-lua (miniredis) assigns flat before it reads it again
        rest = string.sub(flat, cut + 1)
        flat = string.sub(flat, 1, cut - 1)
      end
      if flat ~= '' then
        --[[ decode ]] -- A flat state is 'start count'; anything else fails load's checks.
s1, s2 = string.match(flat, '^(%S*) ?(.*)$')
      end
    end
    -- The state is written flat when it can be: see above.
    local flat_write = IN_CONFIG and not f and kind == 0
    if IN_CONFIG and kind == 1 then
      where = KEYS[REQUESTS + 1]
      local g = redis.pcall('HMGET', where--[[ fields ]] , 'window' .. K, 'count' .. K)
      if g.err then error('REDLIMIT corrupt ' .. where .. ': ' .. g.err, 0) end
      s1, s2 = g[1], g[2]
    end
    -- charge: a grant whatever the limit says (Limiter.Charge), counted as
    -- any grant, so that what it takes past the limit is a debt the next
    -- requests wait out.
    local charge = op == 'charge'
    -- grant_at and grant_size: a refund's grant, its time in µs on Redis's
    -- clock and its permits (PERMITS is 'permits since granted': a lease
    -- giving back what it did not use of a block), so that each rate's
    -- release gives back only what is still counted of that grant, and
    -- never what later grants or time have made another's.
    local permits, grant_at, grant_size, decide = ARGV[PERMITS], nil, nil, op == 'allow' or charge
    if op == 'refund' then
      local n, t, g = string.match(permits, '^(%d+) (%d+) (%d+)$')
      if not n or n + 0 > g + 0 then
        error('REDLIMIT refund ' .. string.format('%q', permits) .. ': want "permits since-µs granted"', 0)
      end
      permits, grant_at, grant_size = n + 0, t + 0, g + 0
    else
      permits = permits + 0
    end
    local allowed, retry, wait, remaining, reset, bound, back = 0, 0, 0, 0, 0, 0, 0
    -- expire: a step wrote state whose expiry must move (IN_CONFIG), and
    -- then writes every field; wrote: a step wrote anything; rewrite: the
    -- state read must be written though nothing was counted (the token
    -- bucket's cache, found wrong); value: the state as encode left it.
    local expire, wrote, rewrite, value = false, false, false, nil
    --[[ load ]] -- Windows never go back: a request whose clock is behind the stored window's
-- (clocks that disagree under WithClock, or a request that reached Redis
-- late) counts in the stored window rather than resetting it. The start is
-- kept in ms, not as an index, so that it stays meaningful across an
-- interval change.
local start, count, stored_start = NOW_MS - NOW_MS % interval, 0, nil
-- A calendar rate's window is the one of the three Go sent that holds now;
-- its interval, that window's length. Clocks a whole window apart refuse.
local edges = calendar and calendar[K]
if edges then
  start = nil
  for e = 1, 3 do
    if NOW_MS >= edges[e] and NOW_MS < edges[e + 1] then
      start, interval = edges[e], edges[e + 1] - edges[e]
    end
  end
  if not start then
    error(string.format('REDLIMIT clock at %d ms is outside the calendar windows the client sent, %d to %d ms',
      NOW_MS, edges[1], edges[4]), 0)
  end
end
if s1 or s2 then
  stored_start = tonumber(s1 or '')
  local stored_count = tonumber(s2 or '')
  if not (stored_start and stored_count and stored_start % 1 + stored_count % 1 == 0
        and stored_start >= 0 and stored_start <= MAX and stored_count >= 0 and stored_count <= MAX) then
    error('REDLIMIT corrupt ' .. where .. ': fields window' .. K .. ', count' .. K .. ' = '
      .. string.format('%q, %q', s1 or 'none', s2 or 'none'), 0)
  end
  if edges and stored_start >= start then
    -- Counted in now's window or a later one (see above), as a start of
    -- another calendar's may be (SetRate keeps the usage): in the one that
    -- holds it.
    if stored_start >= edges[3] then
      start, interval = edges[3], edges[4] - edges[3]
    end
    count = stored_count
  elseif not edges and stored_start - stored_start % interval >= start then
    start, count = stored_start - stored_start % interval, stored_count
  end
end
local ends = (start + interval) * 1000
    local limit = --[[ capacity ]] rate
    if decide then
      if permits > limit and not charge then
        retry = -1
      else
        --[[ wait ]] if count + permits > rate then
  wait = ends - NOW_US
end
      end
    end
    -- The further rates are read before anything is written: each one's
    -- state goes into states, for its steps after the decision, and a
    -- decision weighs its wait. Every rate must allow: a denial is bound by
    -- the longest wait, or by the first rate that can never grant so many.
    local states, longest
    if rates then
      states, longest = { nil, nil }, 0 -- sized for one further rate, the usual
      local most = wait
      for i = 1, n do
        local j, K = 4 * i - 4, RATE_SUFFIX[i + 1]
        local rate, interval, burst, buckets = rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4]
        if interval > longest then longest = interval end
        local s1, s2
        if IN_CONFIG and (f or where ~= KEYS[1]) then
          local g = redis.pcall('HMGET', where--[[ fields ]] , 'window' .. K, 'count' .. K)
          if g.err then error('REDLIMIT corrupt ' .. where .. ': ' .. g.err, 0) end
          s1, s2 = g[1], g[2]
        elseif rest then
          local flat, cut = rest, string.find(rest, ';', 1, true)
          rest = nil
          if cut then
            rest = string.sub(flat, cut + 1)
            flat = string.sub(flat, 1, cut - 1)
          end
          if flat ~= '' then
            --[[ more_decode ]] -- A flat state is 'start count'; anything else fails load's checks.
s1, s2 = string.match(flat, '^(%S*) ?(.*)$')
          end
        end
        --[[ more_load ]] -- Windows never go back: a request whose clock is behind the stored window's
-- (clocks that disagree under WithClock, or a request that reached Redis
-- late) counts in the stored window rather than resetting it. The start is
-- kept in ms, not as an index, so that it stays meaningful across an
-- interval change.
local start, count, stored_start = NOW_MS - NOW_MS % interval, 0, nil
-- A calendar rate's window is the one of the three Go sent that holds now;
-- its interval, that window's length. Clocks a whole window apart refuse.
local edges = calendar and calendar[K]
if edges then
  start = nil
  for e = 1, 3 do
    if NOW_MS >= edges[e] and NOW_MS < edges[e + 1] then
      start, interval = edges[e], edges[e + 1] - edges[e]
    end
  end
  if not start then
    error(string.format('REDLIMIT clock at %d ms is outside the calendar windows the client sent, %d to %d ms',
      NOW_MS, edges[1], edges[4]), 0)
  end
end
if s1 or s2 then
  stored_start = tonumber(s1 or '')
  local stored_count = tonumber(s2 or '')
  if not (stored_start and stored_count and stored_start % 1 + stored_count % 1 == 0
        and stored_start >= 0 and stored_start <= MAX and stored_count >= 0 and stored_count <= MAX) then
    error('REDLIMIT corrupt ' .. where .. ': fields window' .. K .. ', count' .. K .. ' = '
      .. string.format('%q, %q', s1 or 'none', s2 or 'none'), 0)
  end
  if edges and stored_start >= start then
    -- Counted in now's window or a later one (see above), as a start of
    -- another calendar's may be (SetRate keeps the usage): in the one that
    -- holds it.
    if stored_start >= edges[3] then
      start, interval = edges[3], edges[4] - edges[3]
    end
    count = stored_count
  elseif not edges and stored_start - stored_start % interval >= start then
    start, count = stored_start - stored_start % interval, stored_count
  end
end
local ends = (start + interval) * 1000
        if calendar then rates[j + 2] = interval end -- a calendar window's own length (load)
        states[2 * i - 1], states[2 * i] = s1, s2
        local limit = --[[ capacity ]] rate
        if decide and retry ~= -1 then
          if permits > limit and not charge then
            retry, bound = -1, i
          else
            local wait = 0
            --[[ more_wait ]] if count + permits > rate then
  wait = ends - NOW_US
end
            if wait > most then
              most = wait
              if wait > 0 then bound = i end -- a grant is bound by what it leaves
            end
          end
        end
      end
      wait = most
    end
    if charge then
      wait = 0
    end
    local counted = false
    if decide and retry ~= -1 then
      -- Zero permits is a peek: it writes nothing.
      if wait <= 0 then
        allowed = 1
        if permits > 0 and (not LOG or first_run()) then
          counted = true
          --[[ commit ]] count = count + permits
          wrote = counted
        end
      elseif permits > 0 and (--[[ resent ]] false or LOG and redis.call('ZSCORE', KEYS[REQUESTS], ARGV[ID])) then
        allowed = 1 -- a re-sent script whose first run was granted
      else
        retry = wait
      end
    elseif op == 'refund' and redis.call('ZREM', KEYS[REQUESTS], ARGV[ID]) == 1
        or op ~= 'refund' and not decide and (not LOG or first_run()) then
      -- A refund names its take's id, which the take left in the request
      -- log: it gives back once, and nothing after whatever forgot the log
      -- (Reset, Delete, a change of rates: the state its grant was counted
      -- in is gone, or counts otherwise).
      wrote = true
      --[[ release ]] -- A refund's permits are counted here only if granted in this window: one
-- ended has taken them with it.
back = math.min(permits, count)
if grant_at and grant_at < start * 1000 then back = 0 end
count = count - back
    end
    -- What a commit or release left (or a state to rewrite), written as
    -- fields; a flat state is written below, with its expiry.
    if wrote or rewrite then
      --[[ encode ]] -- A new window's first step moves the state's expiry; the others keep it.
-- Only a flat state needs the string: write uses start and count.
value = count > 0 and flat_write and string.format('%d %d', start, count) or nil
expire = count > 0 and start ~= stored_start
      if not flat_write then
        --[[ write ]] -- Within a window, a step writes the count and nothing else.
if count <= 0 then
  redis.call('HDEL', where, 'window' .. K, 'count' .. K)
elseif not expire then
  redis.call('HSET', where, 'count' .. K, string.format('%d', count))
else
  redis.call('HSET', where, 'window' .. K, string.format('%d', start), 'count' .. K, string.format('%d', count))
end
      end
    end
    --[[ report ]] remaining = rate - count
if count > 0 then
  reset = ends - NOW_US
end
    if remaining > limit then remaining = limit elseif remaining < 0 then remaining = 0 end
    soonest = reset
    -- The further rates' steps, each from the state read before: a grant
    -- counts in every one, a release gives back in every one, and the answer
    -- is the smallest remaining and the longest reset.
    -- parts: the further rates' parts of a flat state, each after a ';';
    -- moved: the expiry of one of them moves; kept: one of them is not empty.
    local parts, moved, kept
    if rates then
      local least, latest, given = remaining, reset, back
      for i = 1, n do
        local j, K = 4 * i - 4, RATE_SUFFIX[i + 1]
        local rate, interval, burst, buckets = rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4]
        local s1, s2 = states[2 * i - 1], states[2 * i]
        --[[ more_load ]] -- Windows never go back: a request whose clock is behind the stored window's
-- (clocks that disagree under WithClock, or a request that reached Redis
-- late) counts in the stored window rather than resetting it. The start is
-- kept in ms, not as an index, so that it stays meaningful across an
-- interval change.
local start, count, stored_start = NOW_MS - NOW_MS % interval, 0, nil
-- A calendar rate's window is the one of the three Go sent that holds now;
-- its interval, that window's length. Clocks a whole window apart refuse.
local edges = calendar and calendar[K]
if edges then
  start = nil
  for e = 1, 3 do
    if NOW_MS >= edges[e] and NOW_MS < edges[e + 1] then
      start, interval = edges[e], edges[e + 1] - edges[e]
    end
  end
  if not start then
    error(string.format('REDLIMIT clock at %d ms is outside the calendar windows the client sent, %d to %d ms',
      NOW_MS, edges[1], edges[4]), 0)
  end
end
if s1 or s2 then
  stored_start = tonumber(s1 or '')
  local stored_count = tonumber(s2 or '')
  if not (stored_start and stored_count and stored_start % 1 + stored_count % 1 == 0
        and stored_start >= 0 and stored_start <= MAX and stored_count >= 0 and stored_count <= MAX) then
    error('REDLIMIT corrupt ' .. where .. ': fields window' .. K .. ', count' .. K .. ' = '
      .. string.format('%q, %q', s1 or 'none', s2 or 'none'), 0)
  end
  if edges and stored_start >= start then
    -- Counted in now's window or a later one (see above), as a start of
    -- another calendar's may be (SetRate keeps the usage): in the one that
    -- holds it.
    if stored_start >= edges[3] then
      start, interval = edges[3], edges[4] - edges[3]
    end
    count = stored_count
  elseif not edges and stored_start - stored_start % interval >= start then
    start, count = stored_start - stored_start % interval, stored_count
  end
end
local ends = (start + interval) * 1000
        local limit = --[[ capacity ]] rate
        local remaining, reset, back = 0, 0, 0
        if counted then
          --[[ more_commit ]] count = count + permits
        elseif wrote then
          --[[ more_release ]] -- A refund's permits are counted here only if granted in this window: one
-- ended has taken them with it.
back = math.min(permits, count)
if grant_at and grant_at < start * 1000 then back = 0 end
count = count - back
          if back < given then given = back end
        end
        if wrote then
          local value, expire = nil, false
          --[[ more_encode ]] -- A new window's first step moves the state's expiry; the others keep it.
-- Only a flat state needs the string: write uses start and count.
value = count > 0 and flat_write and string.format('%d %d', start, count) or nil
expire = count > 0 and start ~= stored_start
          if flat_write then
            parts, moved, kept = (parts or '') .. ';' .. (value or ''), moved or expire, kept or value
          else
            --[[ more_write ]] -- Within a window, a step writes the count and nothing else.
if count <= 0 then
  redis.call('HDEL', where, 'window' .. K, 'count' .. K)
elseif not expire then
  redis.call('HSET', where, 'count' .. K, string.format('%d', count))
else
  redis.call('HSET', where, 'window' .. K, string.format('%d', start), 'count' .. K, string.format('%d', count))
end
          end
        end
        --[[ more_report ]] remaining = rate - count
if count > 0 then
  reset = ends - NOW_US
end
        if remaining > limit then remaining = limit elseif remaining < 0 then remaining = 0 end
        if remaining < least then
          least = remaining
          if allowed == 1 then bound = i end
        end
        if reset > latest then latest = reset end
        if reset < soonest then soonest = reset end
      end
      remaining, reset, back = least, latest, given
    end
    -- The state's expiry: a step that moved it, or with several rates any
    -- write, has the hash expire when the last rate is full again, and a
    -- flat state is written with its expiry. KEYS[1] holding a stored
    -- config keeps the config's expiry (none, Expire's, or the keep-alive
    -- below); another key never outlives the config (Expire, ExpireAt).
    local cap = stored and keepalive == 0 and (kind == 1 and counted or where ~= KEYS[1] and (expire or rates and wrote))
        and redis.call('PTTL', KEYS[1])
    local ms = (reset + (-reset) % 1000) / 1000
    if ms < 1 then ms = 1 end
    if flat_write and wrote and (parts or rest) then
      -- Several rates' parts: gone when every one is empty, and expiring
      -- when the last rate is full again.
      if not (value or kept or rest and string.find(rest, '[^;]')) then
        redis.call('DEL', KEYS[1])
      else
        value = (value or '') .. (parts or '') .. (rest and ';' .. rest or '')
        if expire or moved then
          redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ms))
        else
          redis.call('SET', KEYS[1], value, 'KEEPTTL')
        end
      end
    elseif flat_write then
      if value and expire then
        redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ms))
      elseif value then
        redis.call('SET', KEYS[1], value, 'KEEPTTL')
      elseif wrote and flat then
        redis.call('DEL', KEYS[1])
      end
    elseif IN_CONFIG and (expire or rates and wrote) and (where ~= KEYS[1] or not stored) then
      if cap and cap > 0 and cap < ms then ms = cap end
      redis.call('PEXPIRE', where, string.format('%d', ms))
    end
    -- The token bucket on a default keeps its state in keys the others never
    -- read: its marker in KEYS[1] (its name, as a string) shows them it is
    -- there, with the GET they do anyway, and expires with the state. It is
    -- written when a step wrote the state (a grant: one command) or finds
    -- it missing (state from before markers), and goes when the state does.
    -- none: no config, and KEYS[1] empty or holding the marker.
    if none and not IN_CONFIG and kind == 0 and (wrote or not marked) then
      if reset > 0 then
        redis.call('SET', KEYS[1], ALGORITHM, 'PX', string.format('%d', ms))
      elseif marked then
        redis.call('DEL', KEYS[1])
      end
    end
    if counted and kind == 1 then
      -- The registry lets Delete, Reset and Expire reach every client's
      -- keys. It lives as long as any client's state can: one interval, or
      -- the time a funnel takes to drain when its burst exceeds its rate,
      -- the longest of any rate's.
      local added = redis.pcall('ZADD', KEYS[REGISTRY], NOW_MS, ARGV[CLIENT_ID])
      if type(added) == 'table' then
        error('REDLIMIT corrupt ' .. KEYS[REGISTRY] .. ': ' .. added.err, 0)
      end
      local life = math.max(interval, burst * interval / rate)
      for j = 1, 4 * n, 4 do
        life = math.max(life, rates[j + 1], rates[j + 2] * rates[j + 1] / rates[j])
      end
      local ms = life + (-life) % 1
      if cap and cap > 0 and cap < ms then ms = cap end
      redis.call('PEXPIRE', KEYS[REGISTRY], ms)
      -- PerClient state is in keys of each algorithm's own (and the
      -- registry, which all share): on a default, a marker in KEYS[1] as the
      -- token bucket's, but for as long as the registry lives. A flat state
      -- of this algorithm's there (an Overall default's) names it already.
      if none then
        redis.call('SET', KEYS[1], ALGORITHM, 'PX', ms)
      end
    end
    if stored and keepalive > 0 and permits > 0 then
      -- Every acquire keeps the config alive, granted or denied: a saturated
      -- limiter is busy, not idle. State in the config hash keeps it alive as
      -- long as the state counts (a funnel whose burst drains slower).
      local ttl = keepalive
      if decide and IN_CONFIG and kind == 0 and reset > ttl * 1000 then
        ttl = (reset + (-reset) % 1000) / 1000
      end
      redis.call('PEXPIRE', KEYS[1], ttl)
    end
    if not decide then
      return back
    end
    -- The reply, declared in call.go (replyHash and what follows it), which
    -- script.go writes here: its kind, then integers in one string (one
    -- value for the client to read, not six). A hash reply: allowed 0 or 1,
    -- limit, remaining, retry after µs (-1: never), reset after µs, window
    -- ms (the span limit applies to: the interval, or the time a funnel's
    -- burst takes to drain), shadow (1: the stored config's limiter is in
    -- shadow mode, and the client grants what this denies). With several rates, limit and window are still
    -- the first rate's, and follow: the index of the rate that bound the
    -- answer (0 for the first) and the further rates as more holds them
    -- (the client works out their limits and windows: formatting them here
    -- would cost every call).
    -- When the handle's default decided ('default …' or 'defer …') and no
    -- hash holds the state, its client knows every limit and window: a
    -- default reply has allowed, remaining, retry, reset, and the bound
    -- with several rates. Its kind also tells the client that its next
    -- decision finds no hash (source default, not defer).
    if not stored and d == 100 and not (IN_CONFIG and f) and not calendar then
      if rates then
        return --[[ reply_default_rates ]] string.format('d %d %d %d %d %d', allowed, remaining, retry, reset, bound)
      end
      return --[[ reply_default ]] string.format('d %d %d %d %d', allowed, remaining, retry, reset)
    end
    local window = limit * interval / rate
    window = window + (-window) % 1
    if rates then
      if calendar then
        -- The further rates as they are now: a calendar window's length.
        local now = {}
        for j = 1, 4 * n do now[j] = string.format('%d', rates[j]) end
        more = table.concat(now, ' ')
      end
      return --[[ reply_hash_rates ]] string.format('h %d %d %d %d %d %d %d %d ', allowed, limit, remaining, retry, reset, window, shadow, bound) .. more
    end
    return --[[ reply_hash ]] string.format('h %d %d %d %d %d %d %d', allowed, limit, remaining, retry, reset, window, shadow)
  end
end

return decide
end

makers['sliding_window'] = function()
local ALGORITHM, N, IN_CONFIG, RECORDS, BURST, BUCKETS, CALENDAR_RATES = 'sliding_window', 1, true, false, false, true, false
local REGISTRY, REQUESTS = 2, 3 -- KEYS': the client registry, the request log
-- >>> A batch's script (script.go's batchScript) holds what follows, up to
-- the decision's end, once per algorithm, and runs each request's decision
-- on its own keys and arguments: nothing here may read KEYS or ARGV but
-- the decision, which is given them.
-- A string in KEYS[1] is a flat state or a marker (see the decision), and
-- tells the algorithm that wrote it: a marker is the algorithm's name, and
-- each flat state has its own shape (its encode section), so no tag is
-- needed and state written before markers existed reads as it did: a
-- funnel's holds digits and ',' only, a fixed window's a space, a sliding
-- window's a ':' (';' between rates). FOREIGN matches every string this
-- algorithm did not write and, besides its marker, none it did; the token
-- bucket writes only its marker. admin.lua's attribution names the writer.
local FOREIGN = ALGORITHM == 'funnel' and '[^%d,;]' or ALGORITHM == 'fixed_window' and '^[^ ]*$'
    or ALGORITHM == 'sliding_window' and '^[^:]*$' or ''

--[[ helpers ]] 

-- soonest: the last decision's shortest reset, µs, among its rates (reset
-- is the longest): a fixed window's first window to end, where a lease's
-- block must end too; since: when its grant starts to count down, µs, if
-- later than now: a funnel's, queued behind the permits before it (the
-- earliest of its rates'), which a lease's refund names (the lease op
-- below).
local soonest, since = 0, nil

-- The decision (allow) and its inverse (release), on a request's KEYS and
-- ARGV: its reply, or nil for a config that is missing or fails a check
-- here, which goes on to admin.lua, to say what is wrong.
local function decide(KEYS, ARGV)
  -- A batch's requests each carry their clock, or '' for the call's.
  local NOW_US, NOW_MS = NOW_US, NOW_MS
  since = nil
  if ARGV[NOW] ~= '' then
    NOW_US = ARGV[NOW] + 0
    NOW_MS = (NOW_US - NOW_US % 1000) / 1000
  end
  local op, LOG = ARGV[OP], ARGV[LOG_WINDOW] ~= nil and ARGV[LOG_WINDOW] ~= ''
  local rate, interval, kind, burst, buckets, keepalive, stored
  -- shadow: 1 when the stored config's limiter is in shadow mode (SetShadow).
  local shadow = 0
  -- spec: the config's calendar rates (CALENDARS above), or nil; calendar:
  -- their windows' edges, { b0, b1, b2, b3 } by their state fields' K.
  local spec, calendar = nil, nil
  -- K: the suffix of a rate's state fields, '' for the config's own rate.
  local K = ''

  -- A client re-sends a script whose reply it did not read (go-redis does on a
  -- read timeout). Counting it twice only denies sooner, so by default nothing
  -- guards against it. With WithRetryWindow (LOG), the request log remembers
  -- each request id for the window: first_run both checks and records the id,
  -- and is false for a re-run, whose grant is counted already. (The token
  -- bucket's records hold the id of their latest grant too: see its file.)
  local first_run = LOG and function()
    local added = redis.pcall('ZADD', KEYS[REQUESTS], 'NX', NOW_MS + ARGV[LOG_WINDOW], ARGV[ID])
    if type(added) == 'table' then
      error('REDLIMIT corrupt ' .. KEYS[REQUESTS] .. ': ' .. added.err, 0)
    end
    if added == 0 then
      return false
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[REQUESTS], '-inf', NOW_MS)
    redis.call('PEXPIRE', KEYS[REQUESTS], ARGV[LOG_WINDOW])
    return true
  end

  -- KEYS[1] is a hash, or, for an IN_CONFIG algorithm, a flat state: while
  -- no config is stored, the Overall state as a plain string (each rate's
  -- as its encode section writes it), which GET reads and SET … PX writes
  -- at less cost than HMGET, HSET and PEXPIRE. Each read is the likelier
  -- one first, and costs a failed command when wrong: GET for a default
  -- whose last decision found no hash (SOURCE default), HMGET for any
  -- other (defer, a stored config only, fixed); a token bucket's default
  -- only asks whether the hash exists. d and a: ARGV[4]'s first and fourth
  -- bytes, 'd' for either default and 'a' for default.
  -- f: rate, interval, type, keepAliveTime, algorithm, more, shadow, then
  -- burst (BURST) or buckets (BUCKETS), then the state's fields, or nil; flat:
  -- the flat state, or nil; none: KEYS[1] does not exist.
  local d, _, _, a = string.byte(ARGV[CONFIG], 1, 4)
  local f, flat, none, marked = nil, nil, false, false
  if a == 97 then
    local got = redis.pcall('GET', KEYS[1])
    if not got then none = true elseif not got.err then flat = got end
  end
  if not flat and not none then
    f = redis.pcall('HMGET', KEYS[1], 'rate', 'interval', 'type', 'keepAliveTime', 'algorithm', 'more', 'shadow'
      --[[ own_config ]] , 'buckets'--[[ fields ]] , 'counts' .. K)
    if not f.err then
      stored = f[1] or f[2] or f[5]
    elseif redis.call('TYPE', KEYS[1]).ok == 'string' then
      flat, f = redis.call('GET', KEYS[1]), nil
    else
      error('REDLIMIT corrupt ' .. KEYS[1] .. ': ' .. f.err, 0)
    end
  end
  -- One algorithm's state is never counted by another: a string another
  -- wrote (see FOREIGN) goes to admin.lua, which names it. This
  -- algorithm's marker says only that its state is elsewhere: none here.
  local foreign = false
  if flat and string.find(flat, FOREIGN) then
    if flat == ALGORITHM then flat, none, marked = nil, true, true else foreign = true end
  end
  local ok, more = not stored and ARGV[CONFIG] ~= '' and not foreign, nil
  local S = (BURST or BUCKETS or CALENDAR_RATES) and 9 or 8 -- the first state field
  -- A default that found a hash with neither config nor state of its own
  -- (its first rate's): a defer sees whether KEYS[1] is there at all, and if
  -- not, writes the state flat, and the short reply sends the handle back
  -- to default; else a hash of another algorithm's fields (as Throttle
  -- leaves a funnel's) goes to admin.lua too. Not on the usual paths.
  if f and not stored and d == 100 and not (IN_CONFIG and (f[S] or f[S + 1])) then
    if IN_CONFIG and a == 101 and redis.call('EXISTS', KEYS[1]) == 0 then
      f, none = nil, true
    else
      local g = redis.call('HMGET', KEYS[1], 'tat', 'window', 'counts')
      ok = ok and not (g[1] or g[2] or g[3]) -- this algorithm's own are empty
    end
  end
  if stored then
    -- The same checks as admin.lua's stored_config, which names the culprit.
    rate, interval, kind, keepalive = tonumber(f[1]), tonumber(f[2]), tonumber(f[3] or 0), tonumber(f[4] or 0)
    burst, buckets = 0, 0
    if BURST then burst = tonumber(f[8] or 0) elseif BUCKETS then buckets = tonumber(f[8] or 0) elseif CALENDAR_RATES and f[8] and f[8] ~= '' then spec = f[8] end
    ok = rate and interval and kind and burst and buckets and keepalive
        and rate % 1 + interval % 1 + kind % 1 + burst % 1 + buckets % 1 + keepalive % 1 == 0
        and rate >= 1 and rate <= (RECORDS and 4294967295 or MAX) and interval >= 1 and interval <= MAX and (kind == 0 or kind == 1)
        and burst >= 0 and burst <= MAX and buckets >= 0 and buckets <= MAX_BUCKETS and keepalive >= 0 and keepalive <= MAX
        and (buckets == 0 and DEFAULT_BUCKETS or buckets) <= interval and rate <= interval * 1000
        and (f[5] or 'tokenbucket') == ALGORITHM
    more = f[6]
    if f[7] == '1' then shadow = 1 end
  end
  -- The handle's config: a default while none is stored, a fixed one
  -- (Throttle's) even over a stored one, which must still be sound. Go
  -- wrote it: a '0' needs no converting.
  if ok and ARGV[CONFIG] ~= '' and (not stored or string.sub(ARGV[CONFIG], 1, 6) == 'fixed ') then
    local parsed = configs and configs[ARGV[CONFIG]]
    if parsed then
      rate, interval, more, kind, burst, buckets, keepalive, spec = unpack(parsed)
    else
      local r, i, options, rest = string.match(ARGV[CONFIG], '^%a+ (%d+) (%d+) (%d+ %d+ %d+ %d+) ?(.*)$')
      spec = nil
      if string.byte(rest, 1) == 64 then -- '@': calendar rates
        spec, rest = string.match(rest, '^@(%S+) ?(.*)$')
      end
      rate, interval, more = r + 0, i + 0, rest
      kind, burst, buckets, keepalive = 0, 0, 0, 0
      if options ~= '0 0 0 0' then -- Overall, no burst, buckets or keep-alive: most defaults
        local t, b, bk, ka = string.match(options, '^(%d+) (%d+) (%d+) (%d+)$')
        kind, burst, buckets, keepalive = t + 0, b + 0, bk + 0, ka + 0
      end
      if configs then
        configs[ARGV[CONFIG]] = { rate, interval, more, kind, burst, buckets, keepalive, spec }
      end
    end
  end
  -- The further rates, n of them: rate, interval, burst, buckets of each,
  -- flat. Each match starts where the last one ended, so the checks cover
  -- every byte.
  local rates, n = nil, 0
  if ok and more and more ~= '' then
    local last = 0
    ok = string.byte(more, -1) ~= 32 -- a space
    while ok and last < #more do
      local _, r, i, b, bk
      _, last, r, i, b, bk = string.find(more, '^(%d+) (%d+) (%d+) (%d+) ?', last + 1)
      if not last or n == MAX_RATES - 1 then
        ok = false
      else
        -- Only a funnel has a burst and only a sliding window buckets: the
        -- others' are '0', and turning a string into a number costs.
        r, i = r + 0, i + 0
        if b == '0' then b = r else b = b + 0 end
        if bk == '0' then bk = DEFAULT_BUCKETS else bk = bk + 0 end
        ok = r >= 1 and r <= i * 1000 and i <= MAX and b <= MAX and bk <= MAX_BUCKETS and bk <= i
        if rates then
          local j = 4 * n
          rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4] = r, i, b, bk
        else
          rates = { r, i, b, bk } -- built whole: one further rate is the usual
        end
        n = n + 1
      end
    end
  end
  if ok and kind == 1 and not KEYS[REGISTRY] then
    return 'perclient' -- sent with the short key list: see KEYS above
  end
  -- Calendar rates count in windows whose edges Go sent (ARGV[CALENDAR]);
  -- a request that sent none, or another config's, is told which to send.
  ok = ok and (not spec or CALENDAR_RATES)
  if ok and spec then
    local given, edges = string.match(ARGV[CALENDAR] or '', '^(%S+) (.*)$')
    if given ~= spec then
      return 'calendar ' .. spec
    end
    local list, at = {}, 0
    for edge in string.gmatch(edges, '%d+') do list[#list + 1] = edge + 0 end
    calendar = {}
    for place in string.gmatch(spec, '(%d+)=') do
      ok = ok and place + 0 <= n + 1 -- a rate of the config's (admin.lua names one that is not)
      calendar[RATE_SUFFIX[place + 0] or ''] = { list[at + 1], list[at + 2], list[at + 3], list[at + 4] }
      at = at + 4
    end
  end
  if ok then
    if burst == 0 then burst = rate end
    if buckets == 0 then buckets = DEFAULT_BUCKETS end
    -- A flat state holds each rate's part, ';' between them; rest: the
    -- parts after the one read, kept for the further rates (and, beyond
    -- this handle's, for another handle's default that has more).
    local where, s1, s2, rest = KEYS[1], nil, nil, nil
    if f then
      s1, s2 = f[S], f[S + 1]
    elseif flat then
      local cut = string.find(flat, ';', 1, true)
      if cut then -- not one assignment: gopher-lua (miniredis) assigns flat before it reads it again
        rest = string.sub(flat, cut + 1)
        flat = string.sub(flat, 1, cut - 1)
      end
      if flat ~= '' then
        --[[ decode ]] s1 = flat
      end
    end
    -- The state is written flat when it can be: see above.
    local flat_write = IN_CONFIG and not f and kind == 0
    if IN_CONFIG and kind == 1 then
      where = KEYS[REQUESTS + 1]
      local g = redis.pcall('HMGET', where--[[ fields ]] , 'counts' .. K)
      if g.err then error('REDLIMIT corrupt ' .. where .. ': ' .. g.err, 0) end
      s1, s2 = g[1], g[2]
    end
    -- charge: a grant whatever the limit says (Limiter.Charge), counted as
    -- any grant, so that what it takes past the limit is a debt the next
    -- requests wait out.
    local charge = op == 'charge'
    -- grant_at and grant_size: a refund's grant, its time in µs on Redis's
    -- clock and its permits (PERMITS is 'permits since granted': a lease
    -- giving back what it did not use of a block), so that each rate's
    -- release gives back only what is still counted of that grant, and
    -- never what later grants or time have made another's.
    local permits, grant_at, grant_size, decide = ARGV[PERMITS], nil, nil, op == 'allow' or charge
    if op == 'refund' then
      local n, t, g = string.match(permits, '^(%d+) (%d+) (%d+)$')
      if not n or n + 0 > g + 0 then
        error('REDLIMIT refund ' .. string.format('%q', permits) .. ': want "permits since-µs granted"', 0)
      end
      permits, grant_at, grant_size = n + 0, t + 0, g + 0
    else
      permits = permits + 0
    end
    local allowed, retry, wait, remaining, reset, bound, back = 0, 0, 0, 0, 0, 0, 0
    -- expire: a step wrote state whose expiry must move (IN_CONFIG), and
    -- then writes every field; wrote: a step wrote anything; rewrite: the
    -- state read must be written though nothing was counted (the token
    -- bucket's cache, found wrong); value: the state as encode left it.
    local expire, wrote, rewrite, value = false, false, false, nil
    --[[ load ]] -- live: the sub-windows that still count, as index, count, start triples,
-- oldest first; total: their sum; current: this sub-window's index. Time
-- never goes back: a request whose clock is behind the newest sub-window
-- (clocks that disagree under WithClock, or a request that reached Redis
-- late) is decided as of that sub-window, so nothing it would have counted
-- has been dropped as stale already.
local current = NOW_MS * buckets / interval
current = current - current % 1
local live, total = {}, 0
if K ~= '' and type(s1) == 'table' then
  -- A further rate loaded again after the decision gets back what it
  -- loaded before (common.lua keeps s1 and s2, set below).
  live, total = s1, s2
  if #live > 0 and live[#live - 2] > current then current = live[#live - 2] end
elseif s1 then
  -- One pass, each entry matched where the last one ended (the pattern is
  -- anchored there), so anything but 'digits:digits' entries between
  -- commas is refused, and + 0 below cannot fail. Starts stay below
  -- 2^53 / 1000 so that start × buckets is exact. Starts never go back, so
  -- the sub-windows out of this one's window come first and are skipped;
  -- after an interval change two may share an index, and are merged.
  local start, at, n, bad = 0, 1, #s1, string.byte(s1, -1) == 44 -- a trailing ','
  while at <= n and not bad do
    local _, e, since, count = string.find(s1, '^(%d+):(%d+),?', at)
    if e then start = start + since end
    if not e or start > MAX / 1000 then
      bad = true
    else
      local index = start * buckets / interval
      index = index - index % 1
      if index > current - buckets then
        local m = #live -- not #live in each key: gopher-lua (miniredis) assigns as it goes
        count = count + 0
        if m > 0 and live[m - 2] == index then
          live[m - 1], live[m] = live[m - 1] + count, start
        else
          live[m + 1], live[m + 2], live[m + 3] = index, count, start
        end
        total = total + count
      end
      at = e + 1
    end
  end
  if bad then
    error('REDLIMIT corrupt ' .. where .. ': field counts' .. K .. ' = ' .. string.format('%q', s1), 0)
  end
  -- A clock behind the newest sub-window: decided as of that one, whose
  -- window leaves out more of the oldest.
  if #live > 0 and live[#live - 2] > current then
    current = live[#live - 2]
    local kept = {}
    total = 0
    for i = 1, #live, 3 do
      if live[i] > current - buckets then
        local m = #kept
        kept[m + 1], kept[m + 2], kept[m + 3] = live[i], live[i + 1], live[i + 2]
        total = total + live[i + 1]
      end
    end
    live = kept
  end
end
s1, s2 = live, total
    local limit = --[[ capacity ]] rate
    if decide then
      if permits > limit and not charge then
        retry = -1
      else
        --[[ wait ]] -- Enough of the oldest sub-windows must leave the window: the one that
-- frees the last permit needed leaves when sub-window index + buckets
-- begins (index × interval / buckets ms, rounded up).
local need = total + permits - rate
if need > 0 then
  wait = interval * 1000 -- not reached: permits <= rate, so the window holds enough to free
  local freed = 0
  for i = 1, #live, 3 do
    freed = freed + live[i + 1]
    if freed >= need then
      local leaves = (live[i] + buckets) * interval / buckets
      wait = (leaves + (-leaves) % 1) * 1000 - NOW_US
      break
    end
  end
end
      end
    end
    -- The further rates are read before anything is written: each one's
    -- state goes into states, for its steps after the decision, and a
    -- decision weighs its wait. Every rate must allow: a denial is bound by
    -- the longest wait, or by the first rate that can never grant so many.
    local states, longest
    if rates then
      states, longest = { nil, nil }, 0 -- sized for one further rate, the usual
      local most = wait
      for i = 1, n do
        local j, K = 4 * i - 4, RATE_SUFFIX[i + 1]
        local rate, interval, burst, buckets = rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4]
        if interval > longest then longest = interval end
        local s1, s2
        if IN_CONFIG and (f or where ~= KEYS[1]) then
          local g = redis.pcall('HMGET', where--[[ fields ]] , 'counts' .. K)
          if g.err then error('REDLIMIT corrupt ' .. where .. ': ' .. g.err, 0) end
          s1, s2 = g[1], g[2]
        elseif rest then
          local flat, cut = rest, string.find(rest, ';', 1, true)
          rest = nil
          if cut then
            rest = string.sub(flat, cut + 1)
            flat = string.sub(flat, 1, cut - 1)
          end
          if flat ~= '' then
            --[[ more_decode ]] s1 = flat
          end
        end
        --[[ more_load ]] -- live: the sub-windows that still count, as index, count, start triples,
-- oldest first; total: their sum; current: this sub-window's index. Time
-- never goes back: a request whose clock is behind the newest sub-window
-- (clocks that disagree under WithClock, or a request that reached Redis
-- late) is decided as of that sub-window, so nothing it would have counted
-- has been dropped as stale already.
local current = NOW_MS * buckets / interval
current = current - current % 1
local live, total = {}, 0
if K ~= '' and type(s1) == 'table' then
  -- A further rate loaded again after the decision gets back what it
  -- loaded before (common.lua keeps s1 and s2, set below).
  live, total = s1, s2
  if #live > 0 and live[#live - 2] > current then current = live[#live - 2] end
elseif s1 then
  -- One pass, each entry matched where the last one ended (the pattern is
  -- anchored there), so anything but 'digits:digits' entries between
  -- commas is refused, and + 0 below cannot fail. Starts stay below
  -- 2^53 / 1000 so that start × buckets is exact. Starts never go back, so
  -- the sub-windows out of this one's window come first and are skipped;
  -- after an interval change two may share an index, and are merged.
  local start, at, n, bad = 0, 1, #s1, string.byte(s1, -1) == 44 -- a trailing ','
  while at <= n and not bad do
    local _, e, since, count = string.find(s1, '^(%d+):(%d+),?', at)
    if e then start = start + since end
    if not e or start > MAX / 1000 then
      bad = true
    else
      local index = start * buckets / interval
      index = index - index % 1
      if index > current - buckets then
        local m = #live -- not #live in each key: gopher-lua (miniredis) assigns as it goes
        count = count + 0
        if m > 0 and live[m - 2] == index then
          live[m - 1], live[m] = live[m - 1] + count, start
        else
          live[m + 1], live[m + 2], live[m + 3] = index, count, start
        end
        total = total + count
      end
      at = e + 1
    end
  end
  if bad then
    error('REDLIMIT corrupt ' .. where .. ': field counts' .. K .. ' = ' .. string.format('%q', s1), 0)
  end
  -- A clock behind the newest sub-window: decided as of that one, whose
  -- window leaves out more of the oldest.
  if #live > 0 and live[#live - 2] > current then
    current = live[#live - 2]
    local kept = {}
    total = 0
    for i = 1, #live, 3 do
      if live[i] > current - buckets then
        local m = #kept
        kept[m + 1], kept[m + 2], kept[m + 3] = live[i], live[i + 1], live[i + 2]
        total = total + live[i + 1]
      end
    end
    live = kept
  end
end
s1, s2 = live, total
        if calendar then rates[j + 2] = interval end -- a calendar window's own length (load)
        states[2 * i - 1], states[2 * i] = s1, s2
        local limit = --[[ capacity ]] rate
        if decide and retry ~= -1 then
          if permits > limit and not charge then
            retry, bound = -1, i
          else
            local wait = 0
            --[[ more_wait ]] -- Enough of the oldest sub-windows must leave the window: the one that
-- frees the last permit needed leaves when sub-window index + buckets
-- begins (index × interval / buckets ms, rounded up).
local need = total + permits - rate
if need > 0 then
  wait = interval * 1000 -- not reached: permits <= rate, so the window holds enough to free
  local freed = 0
  for i = 1, #live, 3 do
    freed = freed + live[i + 1]
    if freed >= need then
      local leaves = (live[i] + buckets) * interval / buckets
      wait = (leaves + (-leaves) % 1) * 1000 - NOW_US
      break
    end
  end
end
            if wait > most then
              most = wait
              if wait > 0 then bound = i end -- a grant is bound by what it leaves
            end
          end
        end
      end
      wait = most
    end
    if charge then
      wait = 0
    end
    local counted = false
    if decide and retry ~= -1 then
      -- Zero permits is a peek: it writes nothing.
      if wait <= 0 then
        allowed = 1
        if permits > 0 and (not LOG or first_run()) then
          counted = true
          --[[ commit ]] -- The key's expiry moves only when the current sub-window is new.
if #live == 0 or live[#live - 2] ~= current then
  local start = current * interval / buckets
  live[#live + 1] = current
  live[#live + 1] = 0
  live[#live + 1] = start + (-start) % 1
  expire = true
end
live[#live - 1] = live[#live - 1] + permits
total = total + permits
          wrote = counted
        end
      elseif permits > 0 and (--[[ resent ]] false or LOG and redis.call('ZSCORE', KEYS[REQUESTS], ARGV[ID])) then
        allowed = 1 -- a re-sent script whose first run was granted
      else
        retry = wait
      end
    elseif op == 'refund' and redis.call('ZREM', KEYS[REQUESTS], ARGV[ID]) == 1
        or op ~= 'refund' and not decide and (not LOG or first_run()) then
      -- A refund names its take's id, which the take left in the request
      -- log: it gives back once, and nothing after whatever forgot the log
      -- (Reset, Delete, a change of rates: the state its grant was counted
      -- in is gone, or counts otherwise).
      wrote = true
      --[[ release ]] -- Permits come back from the newest sub-windows first; those it empties
-- go, so the state may expire sooner. A refund's come back from its
-- grant's sub-window only: a newer one's count would outlive them.
local left = permits
local of = grant_at and (grant_at - grant_at % 1000) / 1000 * buckets / interval
if of then of = of - of % 1 end
for i = #live - 2, 1, -3 do
  if left == 0 then break end
  if not of or live[i] == of then
    local taken = math.min(left, live[i + 1])
    live[i + 1] = live[i + 1] - taken
    left = left - taken
  end
end
while #live > 0 and live[#live - 1] == 0 do
  table.remove(live)
  table.remove(live)
  table.remove(live)
end
back, expire = permits - left, true
    end
    -- What a commit or release left (or a state to rewrite), written as
    -- fields; a flat state is written below, with its expiry.
    if wrote or rewrite then
      --[[ encode ]] -- The sub-windows that still count, as the field keeps them; none, and the
-- field goes. Numbers below 10^14 concatenate exactly (Redis formats them
-- with %.14g): starts in ms and their gaps do; a count may not.
value = nil
local before = 0
for i = 1, #live, 3 do
  if live[i + 1] > 0 then
    local count = live[i + 1]
    if count >= 1e14 then count = string.format('%d', count) end
    local entry = (live[i + 2] - before) .. ':' .. count
    if value then value = value .. ',' .. entry else value = entry end
    before = live[i + 2]
  end
end
      if not flat_write then
        --[[ write ]] if value then
  redis.call('HSET', where, 'counts' .. K, value)
else
  redis.call('HDEL', where, 'counts' .. K)
end
      end
    end
    --[[ report ]] -- Full again when the newest sub-window leaves the window.
remaining = rate - total
if #live > 0 then
  local leaves = (live[#live - 2] + buckets) * interval / buckets
  reset = (leaves + (-leaves) % 1) * 1000 - NOW_US
end
    if remaining > limit then remaining = limit elseif remaining < 0 then remaining = 0 end
    soonest = reset
    -- The further rates' steps, each from the state read before: a grant
    -- counts in every one, a release gives back in every one, and the answer
    -- is the smallest remaining and the longest reset.
    -- parts: the further rates' parts of a flat state, each after a ';';
    -- moved: the expiry of one of them moves; kept: one of them is not empty.
    local parts, moved, kept
    if rates then
      local least, latest, given = remaining, reset, back
      for i = 1, n do
        local j, K = 4 * i - 4, RATE_SUFFIX[i + 1]
        local rate, interval, burst, buckets = rates[j + 1], rates[j + 2], rates[j + 3], rates[j + 4]
        local s1, s2 = states[2 * i - 1], states[2 * i]
        --[[ more_load ]] -- live: the sub-windows that still count, as index, count, start triples,
-- oldest first; total: their sum; current: this sub-window's index. Time
-- never goes back: a request whose clock is behind the newest sub-window
-- (clocks that disagree under WithClock, or a request that reached Redis
-- late) is decided as of that sub-window, so nothing it would have counted
-- has been dropped as stale already.
local current = NOW_MS * buckets / interval
current = current - current % 1
local live, total = {}, 0
if K ~= '' and type(s1) == 'table' then
  -- A further rate loaded again after the decision gets back what it
  -- loaded before (common.lua keeps s1 and s2, set below).
  live, total = s1, s2
  if #live > 0 and live[#live - 2] > current then current = live[#live - 2] end
elseif s1 then
  -- One pass, each entry matched where the last one ended (the pattern is
  -- anchored there), so anything but 'digits:digits' entries between
  -- commas is refused, and + 0 below cannot fail. Starts stay below
  -- 2^53 / 1000 so that start × buckets is exact. Starts never go back, so
  -- the sub-windows out of this one's window come first and are skipped;
  -- after an interval change two may share an index, and are merged.
  local start, at, n, bad = 0, 1, #s1, string.byte(s1, -1) == 44 -- a trailing ','
  while at <= n and not bad do
    local _, e, since, count = string.find(s1, '^(%d+):(%d+),?', at)
    if e then start = start + since end
    if not e or start > MAX / 1000 then
      bad = true
    else
      local index = start * buckets / interval
      index = index - index % 1
      if index > current - buckets then
        local m = #live -- not #live in each key: gopher-lua (miniredis) assigns as it goes
        count = count + 0
        if m > 0 and live[m - 2] == index then
          live[m - 1], live[m] = live[m - 1] + count, start
        else
          live[m + 1], live[m + 2], live[m + 3] = index, count, start
        end
        total = total + count
      end
      at = e + 1
    end
  end
  if bad then
    error('REDLIMIT corrupt ' .. where .. ': field counts' .. K .. ' = ' .. string.format('%q', s1), 0)
  end
  -- A clock behind the newest sub-window: decided as of that one, whose
  -- window leaves out more of the oldest.
  if #live > 0 and live[#live - 2] > current then
    current = live[#live - 2]
    local kept = {}
    total = 0
    for i = 1, #live, 3 do
      if live[i] > current - buckets then
        local m = #kept
        kept[m + 1], kept[m + 2], kept[m + 3] = live[i], live[i + 1], live[i + 2]
        total = total + live[i + 1]
      end
    end
    live = kept
  end
end
s1, s2 = live, total
        local limit = --[[ capacity ]] rate
        local remaining, reset, back = 0, 0, 0
        if counted then
          --[[ more_commit ]] -- The key's expiry moves only when the current sub-window is new.
if #live == 0 or live[#live - 2] ~= current then
  local start = current * interval / buckets
  live[#live + 1] = current
  live[#live + 1] = 0
  live[#live + 1] = start + (-start) % 1
  expire = true
end
live[#live - 1] = live[#live - 1] + permits
total = total + permits
        elseif wrote then
          --[[ more_release ]] -- Permits come back from the newest sub-windows first; those it empties
-- go, so the state may expire sooner. A refund's come back from its
-- grant's sub-window only: a newer one's count would outlive them.
local left = permits
local of = grant_at and (grant_at - grant_at % 1000) / 1000 * buckets / interval
if of then of = of - of % 1 end
for i = #live - 2, 1, -3 do
  if left == 0 then break end
  if not of or live[i] == of then
    local taken = math.min(left, live[i + 1])
    live[i + 1] = live[i + 1] - taken
    left = left - taken
  end
end
while #live > 0 and live[#live - 1] == 0 do
  table.remove(live)
  table.remove(live)
  table.remove(live)
end
back, expire = permits - left, true
          if back < given then given = back end
        end
        if wrote then
          local value, expire = nil, false
          --[[ more_encode ]] -- The sub-windows that still count, as the field keeps them; none, and the
-- field goes. Numbers below 10^14 concatenate exactly (Redis formats them
-- with %.14g): starts in ms and their gaps do; a count may not.
value = nil
local before = 0
for i = 1, #live, 3 do
  if live[i + 1] > 0 then
    local count = live[i + 1]
    if count >= 1e14 then count = string.format('%d', count) end
    local entry = (live[i + 2] - before) .. ':' .. count
    if value then value = value .. ',' .. entry else value = entry end
    before = live[i + 2]
  end
end
          if flat_write then
            parts, moved, kept = (parts or '') .. ';' .. (value or ''), moved or expire, kept or value
          else
            --[[ more_write ]] if value then
  redis.call('HSET', where, 'counts' .. K, value)
else
  redis.call('HDEL', where, 'counts' .. K)
end
          end
        end
        --[[ more_report ]] -- Full again when the newest sub-window leaves the window.
remaining = rate - total
if #live > 0 then
  local leaves = (live[#live - 2] + buckets) * interval / buckets
  reset = (leaves + (-leaves) % 1) * 1000 - NOW_US
end
        if remaining > limit then remaining = limit elseif remaining < 0 then remaining = 0 end
        if remaining < least then
          least = remaining
          if allowed == 1 then bound = i end
        end
        if reset > latest then latest = reset end
        if reset < soonest then soonest = reset end
      end
      remaining, reset, back = least, latest, given
    end
    -- The state's expiry: a step that moved it, or with several rates any
    -- write, has the hash expire when the last rate is full again, and a
    -- flat state is written with its expiry. KEYS[1] holding a stored
    -- config keeps the config's expiry (none, Expire's, or the keep-alive
    -- below); another key never outlives the config (Expire, ExpireAt).
    local cap = stored and keepalive == 0 and (kind == 1 and counted or where ~= KEYS[1] and (expire or rates and wrote))
        and redis.call('PTTL', KEYS[1])
    local ms = (reset + (-reset) % 1000) / 1000
    if ms < 1 then ms = 1 end
    if flat_write and wrote and (parts or rest) then
      -- Several rates' parts: gone when every one is empty, and expiring
      -- when the last rate is full again.
      if not (value or kept or rest and string.find(rest, '[^;]')) then
        redis.call('DEL', KEYS[1])
      else
        value = (value or '') .. (parts or '') .. (rest and ';' .. rest or '')
        if expire or moved then
          redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ms))
        else
          redis.call('SET', KEYS[1], value, 'KEEPTTL')
        end
      end
    elseif flat_write then
      if value and expire then
        redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ms))
      elseif value then
        redis.call('SET', KEYS[1], value, 'KEEPTTL')
      elseif wrote and flat then
        redis.call('DEL', KEYS[1])
      end
    elseif IN_CONFIG and (expire or rates and wrote) and (where ~= KEYS[1] or not stored) then
      if cap and cap > 0 and cap < ms then ms = cap end
      redis.call('PEXPIRE', where, string.format('%d', ms))
    end
    -- The token bucket on a default keeps its state in keys the others never
    -- read: its marker in KEYS[1] (its name, as a string) shows them it is
    -- there, with the GET they do anyway, and expires with the state. It is
    -- written when a step wrote the state (a grant: one command) or finds
    -- it missing (state from before markers), and goes when the state does.
    -- none: no config, and KEYS[1] empty or holding the marker.
    if none and not IN_CONFIG and kind == 0 and (wrote or not marked) then
      if reset > 0 then
        redis.call('SET', KEYS[1], ALGORITHM, 'PX', string.format('%d', ms))
      elseif marked then
        redis.call('DEL', KEYS[1])
      end
    end
    if counted and kind == 1 then
      -- The registry lets Delete, Reset and Expire reach every client's
      -- keys. It lives as long as any client's state can: one interval, or
      -- the time a funnel takes to drain when its burst exceeds its rate,
      -- the longest of any rate's.
      local added = redis.pcall('ZADD', KEYS[REGISTRY], NOW_MS, ARGV[CLIENT_ID])
      if type(added) == 'table' then
        error('REDLIMIT corrupt ' .. KEYS[REGISTRY] .. ': ' .. added.err, 0)
      end
      local life = math.max(interval, burst * interval / rate)
      for j = 1, 4 * n, 4 do
        life = math.max(life, rates[j + 1], rates[j + 2] * rates[j + 1] / rates[j])
      end
      local ms = life + (-life) % 1
      if cap and cap > 0 and cap < ms then ms = cap end
      redis.call('PEXPIRE', KEYS[REGISTRY], ms)
      -- PerClient state is in keys of each algorithm's own (and the
      -- registry, which all share): on a default, a marker in KEYS[1] as the
      -- token bucket's, but for as long as the registry lives. A flat state
      -- of this algorithm's there (an Overall default's) names it already.
      if none then
        redis.call('SET', KEYS[1], ALGORITHM, 'PX', ms)
      end
    end
    if stored and keepalive > 0 and permits > 0 then
      -- Every acquire keeps the config alive, granted or denied: a saturated
      -- limiter is busy, not idle. State in the config hash keeps it alive as
      -- long as the state counts (a funnel whose burst drains slower).
      local ttl = keepalive
      if decide and IN_CONFIG and kind == 0 and reset > ttl * 1000 then
        ttl = (reset + (-reset) % 1000) / 1000
      end
      redis.call('PEXPIRE', KEYS[1], ttl)
    end
    if not decide then
      return back
    end
    -- The reply, declared in call.go (replyHash and what follows it), which
    -- script.go writes here: its kind, then integers in one string (one
    -- value for the client to read, not six). A hash reply: allowed 0 or 1,
    -- limit, remaining, retry after µs (-1: never), reset after µs, window
    -- ms (the span limit applies to: the interval, or the time a funnel's
    -- burst takes to drain), shadow (1: the stored config's limiter is in
    -- shadow mode, and the client grants what this denies). With several rates, limit and window are still
    -- the first rate's, and follow: the index of the rate that bound the
    -- answer (0 for the first) and the further rates as more holds them
    -- (the client works out their limits and windows: formatting them here
    -- would cost every call).
    -- When the handle's default decided ('default …' or 'defer …') and no
    -- hash holds the state, its client knows every limit and window: a
    -- default reply has allowed, remaining, retry, reset, and the bound
    -- with several rates. Its kind also tells the client that its next
    -- decision finds no hash (source default, not defer).
    if not stored and d == 100 and not (IN_CONFIG and f) and not calendar then
      if rates then
        return --[[ reply_default_rates ]] string.format('d %d %d %d %d %d', allowed, remaining, retry, reset, bound)
      end
      return --[[ reply_default ]] string.format('d %d %d %d %d', allowed, remaining, retry, reset)
    end
    local window = limit * interval / rate
    window = window + (-window) % 1
    if rates then
      if calendar then
        -- The further rates as they are now: a calendar window's length.
        local now = {}
        for j = 1, 4 * n do now[j] = string.format('%d', rates[j]) end
        more = table.concat(now, ' ')
      end
      return --[[ reply_hash_rates ]] string.format('h %d %d %d %d %d %d %d %d ', allowed, limit, remaining, retry, reset, window, shadow, bound) .. more
    end
    return --[[ reply_hash ]] string.format('h %d %d %d %d %d %d %d', allowed, limit, remaining, retry, reset, window, shadow)
  end
end

return decide
end

-- A batch: the decisions of many callers in one script call (batch.go).
-- Before this file, script.go puts common.lua's start (the call's clock)
-- and, for each algorithm, makers[name]: a function that makes its decide,
-- common.lua's decision with the algorithm's sections pasted in. Each is
-- made once per call, when its first request comes.
--
-- KEYS     every request's keys, one request's after another's
-- ARGV[1]  'batch'
-- ARGV[2]  now in µs, or '' to read Redis TIME, once for the batch
-- ARGV[3 ..]  per request, in the order the callers came: its algorithm,
--          how many keys it has, how many arguments, then its arguments,
--          as a lone call's ARGV (an ARGV[2] of '' is the batch's clock)
--
-- The reply has one element per request, in order: the decision's reply (a
-- string; a release's integer), 'admin' for a request the decision refused
-- (its client sends it again alone, for admin.lua to say why), or {error}
-- for one whose decision raised an error: that request's alone. A request
-- is decided exactly as it would be alone at the batch's time.
local deciders, replies, k, a = {}, {}, 1, 3
while a <= #ARGV do
  local name, nk, na = ARGV[a], ARGV[a + 1] + 0, ARGV[a + 2] + 0
  local decide = deciders[name]
  if not decide then
    decide = makers[name]()
    deciders[name] = decide
  end
  local ok, reply = pcall(decide, { unpack(KEYS, k, k + nk - 1) }, { unpack(ARGV, a + 3, a + 2 + na) })
  if not ok then
    -- Redis raises its errors as tables, the scripts theirs as strings.
    if type(reply) == 'table' then reply = reply.err end
    reply = { type(reply) == 'string' and reply or 'error' }
  elseif reply == nil then
    reply = 'admin'
  end
  replies[#replies + 1] = reply
  k, a = k + nk, a + 3 + na
end
return replies
