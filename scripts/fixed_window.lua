-- Fixed window: at most rate permits per window of interval, windows aligned
-- to the Unix epoch so every instance agrees where one starts; or, for a
-- calendar rate, the calendar's windows, whose edges Go sends (calendar.go).
-- State: fields window (its start in ms) and count (permits granted in it),
-- or a flat state 'window count'; they expire with their window. Sections: see common.lua.

--[[@helpers]]

--[[@fields]]
, 'window' .. K, 'count' .. K

--[[@capacity]]
rate

--[[@decode]]
-- A flat state is 'start count'; anything else fails load's checks.
s1, s2 = string.match(flat, '^(%S*) ?(.*)$')

--[[@load]]
-- Windows never go back: a request whose clock is behind the stored window's
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

--[[@wait]]
if count + permits > rate then
  wait = ends - NOW_US
end

--[[@commit]]
count = count + permits

--[[@resent]]
false

--[[@release]]
-- A refund's permits are counted here only if granted in this window: one
-- ended has taken them with it.
back = math.min(permits, count)
if grant_at and grant_at < start * 1000 then back = 0 end
count = count - back

--[[@encode]]
-- A new window's first step moves the state's expiry; the others keep it.
-- Only a flat state needs the string: write uses start and count.
value = count > 0 and flat_write and string.format('%d %d', start, count) or nil
expire = count > 0 and start ~= stored_start

--[[@write]]
-- Within a window, a step writes the count and nothing else.
if count <= 0 then
  redis.call('HDEL', where, 'window' .. K, 'count' .. K)
elseif not expire then
  redis.call('HSET', where, 'count' .. K, string.format('%d', count))
else
  redis.call('HSET', where, 'window' .. K, string.format('%d', start), 'count' .. K, string.format('%d', count))
end

--[[@report]]
remaining = rate - count
if count > 0 then
  reset = ends - NOW_US
end

--[[@admin]]
local TYPES, FIELDS, settle = { 'hash' }, { 'window', 'count' }, nil
