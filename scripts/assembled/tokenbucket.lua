-- Declared by script.go's header, from Go.
local OP, NOW, PERMITS, CONFIG, CALENDAR, ID, LOG_WINDOW, CLIENT_ID, OTHERS = 1, 2, 3, 4, 5, 6, 7, 8, 9 -- ARGV's
local MAX_RATES, DEFAULT_BUCKETS, MAX_BUCKETS = 4, 10, 1000
local RATE_SUFFIX = { '', '2', '3', '4' } -- a rate's state fields' suffix, by its place in the config
local REPLY_REMAINING = { h = 3, d = 2 } -- a reply's remaining, by its kind: the nth number after it
local ALGORITHM, N, IN_CONFIG, RECORDS, BURST, BUCKETS, CALENDAR_RATES = 'tokenbucket', 3, false, true, false, false, false
local REGISTRY, REQUESTS = 5, 6 -- KEYS': the client registry, the request log
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
-- <<< The decision's end.

if op == 'allow' or op == 'release' or op == 'charge' or op == 'refund' then
  local reply = decide(KEYS, ARGV)
  if reply ~= nil then
    return reply
  end
elseif op == 'lease' then
  -- A lease (lease.go) takes a block of permits, PERMITS 'want least': want
  -- if they fit now, else as many as fit if that is least or more. It is
  -- the decision of the permits taken, with ' @at taken soonest' after its
  -- reply: the grant's time on Redis's clock (now, or since), which a
  -- refund names, the permits taken (0: denied, as the reply says), and
  -- the shortest reset of its rates (see soonest).
  local want, least = string.match(ARGV[PERMITS], '^(%d+) (%d+)$')
  if not want or least + 0 > want + 0 then
    error('REDLIMIT lease ' .. string.format('%q', ARGV[PERMITS]) .. ': want "want least"', 0)
  end
  local args = { unpack(ARGV) }
  args[OP], args[PERMITS] = 'allow', want
  -- A take re-sent under a request log (WithRetryWindow) is not counted
  -- again, and its first run took least or more: it says least, so that
  -- its client never holds more than Redis counted.
  if ARGV[LOG_WINDOW] and ARGV[LOG_WINDOW] ~= '' then
    local seen = redis.pcall('ZSCORE', KEYS[REQUESTS], ARGV[ID])
    if seen and not seen.err then args[PERMITS] = least end
  end
  local reply = decide(KEYS, args)
  -- A decision's reply is its kind, one letter, then allowed and the rest;
  -- any other ('calendar …') goes back as it is, for the client to act on.
  local decided = type(reply) == 'string' and string.byte(reply, 2) == 32
  if decided and string.byte(reply, 3) == 48 and want ~= least then
    -- Denied: the permits that fit now are the reply's remaining.
    local fit, at = nil, REPLY_REMAINING[string.sub(reply, 1, 1)]
    for v in string.gmatch(reply, ' (%d+)') do
      at = at - 1
      if at == 0 then fit = v break end
    end
    if fit and fit + 0 >= least + 0 then
      args[PERMITS] = fit
      reply = decide(KEYS, args)
    end
  end
  if decided then
    local taken = string.byte(reply, 3) == 49 and args[PERMITS] or '0'
    return reply .. string.format(' @%d ', since or NOW_US) .. taken .. string.format(' %d', soonest)
  elseif reply ~= nil then
    return reply
  end
end
-- admin.lua's ops set these as the decision does its own.
local rate, interval, kind, burst, buckets, keepalive, stored
local K = ''
-- Everything but a decision: the ops that read or change a limiter as a
-- whole, and the diagnosis of a config the decision refused. Nothing here is
-- created on a decision's path.

--[[ tools ]] -- The helpers of the admin ops and of a refused decision's diagnosis.
-- script.go pastes this file after the decision block, so that no function
-- is created on a decision's path.

local function fail(why)
  error('REDLIMIT ' .. why, 0)
end

-- call runs a command on key and turns an error into a clear one naming the
-- key and the command (Redis before 7.2 names no command in an ACL refusal).
local function call(key, command, ...)
  local reply = redis.pcall(command, ...)
  if type(reply) == 'table' and reply.err then
    fail('corrupt ' .. key .. ': ' .. reply.err .. ' (' .. command .. ')')
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

--[[ admin ]] local TYPES, FIELDS = { 'string', 'zset', 'zset' }, {}

-- settle recomputes the cache from the log after a rate change.
local function settle(keys)
  local log = keys[2]
  redis.call('ZREMRANGEBYSCORE', log, '-inf', NOW_MS - interval)
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')[2]
  local reset = newest and (newest + interval) * 1000 - NOW_US or 0
  store(keys[1], log, rate - sum(log, call(log, 'ZRANGE', log, 0, -1), 1), reset > 0 and ttl(reset, stored and keepalive == 0 and KEYS[1]))
end

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
