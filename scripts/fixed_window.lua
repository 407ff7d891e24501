-- Fixed window: at most rate permits per window of interval, windows aligned
-- to the Unix epoch so every instance agrees where one starts.
-- State: fields window (its start in ms) and count (permits granted in it);
-- they expire with their window. Sections: see common.lua.

--[[@helpers]]

--[[@fields]]
, 'window' .. K, 'count' .. K
--[[@capacity]]
rate
--[[@load]]
-- Windows never go back: a request whose clock is behind the stored window's
-- (clocks that disagree under WithClock, or a request that reached Redis
-- late) counts in the stored window rather than resetting it. The start is
-- kept in ms, not as an index, so that it stays meaningful across an
-- interval change.
local start, count, stored_start = NOW_MS - NOW_MS % interval, 0, nil
if s1 or s2 then
  stored_start = integer(where, 'window' .. K, s1, 0, MAX)
  local stored_count = integer(where, 'count' .. K, s2, 0, MAX)
  if stored_start == nil or stored_count == nil then
    fail('corrupt ' .. where .. ': half a window')
  end
  if stored_start - stored_start % interval >= start then
    start, count = stored_start - stored_start % interval, stored_count
  end
end
local ends = (start + interval) * 1000
--[[@wait]]
if count + permits > rate then
  wait = ends - NOW_US
end
--[[@commit]]
-- Within a window, a grant adds to the count and nothing else; a new
-- window's first one sets the key's expiry too.
count = count + permits
if start == stored_start then
  redis.call('HINCRBY', where, 'count' .. K, permits)
else
  save(where, ends - NOW_US, 'window' .. K, start, 'count' .. K, count)
end
--[[@resent]]
false
--[[@report]]
remaining = rate - count
if count > 0 then
  reset = ends - NOW_US
end
--[[@release]]
back = math.min(permits, count)
count = count - back
if count <= 0 then
  redis.call('HDEL', where, 'window' .. K, 'count' .. K)
elseif start == stored_start then
  redis.call('HINCRBY', where, 'count' .. K, -back)
else
  save(where, ends - NOW_US, 'window' .. K, start, 'count' .. K, count)
end
--[[@admin]]
local TYPES, FIELDS, settle = { 'hash' }, { 'window', 'count' }, nil
