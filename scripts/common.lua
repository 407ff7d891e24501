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

--[[@helpers]]

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
      --[[@own_config]]--[[@fields]])
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
        --[[@decode]]
      end
    end
    -- The state is written flat when it can be: see above.
    local flat_write = IN_CONFIG and not f and kind == 0
    if IN_CONFIG and kind == 1 then
      where = KEYS[REQUESTS + 1]
      local g = redis.pcall('HMGET', where--[[@fields]])
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
    --[[@load]]
    local limit = --[[@capacity]]
    if decide then
      if permits > limit and not charge then
        retry = -1
      else
        --[[@wait]]
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
          local g = redis.pcall('HMGET', where--[[@fields]])
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
            --[[@more_decode]]
          end
        end
        --[[@more_load]]
        if calendar then rates[j + 2] = interval end -- a calendar window's own length (load)
        states[2 * i - 1], states[2 * i] = s1, s2
        local limit = --[[@capacity]]
        if decide and retry ~= -1 then
          if permits > limit and not charge then
            retry, bound = -1, i
          else
            local wait = 0
            --[[@more_wait]]
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
          --[[@commit]]
          wrote = counted
        end
      elseif permits > 0 and (--[[@resent]] or LOG and redis.call('ZSCORE', KEYS[REQUESTS], ARGV[ID])) then
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
      --[[@release]]
    end
    -- What a commit or release left (or a state to rewrite), written as
    -- fields; a flat state is written below, with its expiry.
    if wrote or rewrite then
      --[[@encode]]
      if not flat_write then
        --[[@write]]
      end
    end
    --[[@report]]
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
        --[[@more_load]]
        local limit = --[[@capacity]]
        local remaining, reset, back = 0, 0, 0
        if counted then
          --[[@more_commit]]
        elseif wrote then
          --[[@more_release]]
          if back < given then given = back end
        end
        if wrote then
          local value, expire = nil, false
          --[[@more_encode]]
          if flat_write then
            parts, moved, kept = (parts or '') .. ';' .. (value or ''), moved or expire, kept or value
          else
            --[[@more_write]]
          end
        end
        --[[@more_report]]
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
        return --[[@reply_default_rates]]
      end
      return --[[@reply_default]]
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
      return --[[@reply_hash_rates]]
    end
    return --[[@reply_hash]]
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
