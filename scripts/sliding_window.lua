-- Sliding window counters: the interval split into buckets sub-windows,
-- aligned to the Unix epoch; a decision sums the last `buckets` sub-windows,
-- so no span shorter than interval × (buckets − 1) / buckets holds more than
-- rate grants.
-- State: field counts, the live sub-windows oldest first, each as
-- 'start:count' with start in ms, the first absolute and each next one as
-- the ms since the one before ('1700000000000:3,1000:5'; a flat state is
-- the same string). Starts, not
-- indexes, keep their place in time across an interval change. The state
-- expires when the newest sub-window leaves the window. Sections: see
-- common.lua.

--[[@helpers]]

--[[@fields]]
, 'counts' .. K

--[[@capacity]]
rate

--[[@decode]]
s1 = flat

--[[@load]]
-- live: the sub-windows that still count, as index, count, start triples,
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

--[[@wait]]
-- Enough of the oldest sub-windows must leave the window: the one that
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

--[[@commit]]
-- The key's expiry moves only when the current sub-window is new.
if #live == 0 or live[#live - 2] ~= current then
  local start = current * interval / buckets
  live[#live + 1] = current
  live[#live + 1] = 0
  live[#live + 1] = start + (-start) % 1
  expire = true
end
live[#live - 1] = live[#live - 1] + permits
total = total + permits

--[[@resent]]
false

--[[@release]]
-- Permits come back from the newest sub-windows first; those it empties
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

--[[@encode]]
-- The sub-windows that still count, as the field keeps them; none, and the
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

--[[@write]]
if value then
  redis.call('HSET', where, 'counts' .. K, value)
else
  redis.call('HDEL', where, 'counts' .. K)
end

--[[@report]]
-- Full again when the newest sub-window leaves the window.
remaining = rate - total
if #live > 0 then
  local leaves = (live[#live - 2] + buckets) * interval / buckets
  reset = (leaves + (-leaves) % 1) * 1000 - NOW_US
end

--[[@admin]]
local TYPES, FIELDS, settle = { 'hash' }, { 'counts' }, nil
