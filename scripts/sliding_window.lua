-- Sliding window counters: the interval split into buckets sub-windows,
-- aligned to the Unix epoch; a decision sums the last `buckets` sub-windows,
-- so no span shorter than interval × (buckets − 1) / buckets holds more than
-- rate grants.
-- State: field counts, the live sub-windows oldest first, each as
-- 'start:count' with start in ms, the first absolute and each next one as
-- the ms since the one before ('1700000000000:3,1000:5'; a flat state is
-- the same string). Starts, not indexes, keep their place in time across an
-- interval change. The state expires when the newest sub-window leaves the
-- window.
-- A module of decide.lua: see there for what each function is given.

local sliding = {}

function sliding.capacity(s)
  return s.rate
end

-- load reads the sub-windows that still count into s.live, as index, count,
-- start triples, oldest first; s.total is their sum, s.current this
-- sub-window's index. Time never goes back: a request whose clock is behind
-- the newest sub-window (clocks that disagree under WithClock, or a request
-- that reached Redis late) is decided as of that sub-window, so nothing it
-- would have counted has been dropped as stale already.
function sliding.load(s, v, _, now)
  local buckets, interval = s.buckets, s.interval
  local now_ms = (now - now % 1000) / 1000
  local current = now_ms * buckets / interval
  current = current - current % 1
  local live, total = {}, 0
  if v then
    -- One pass, each entry matched where the last one ended (the pattern is
    -- anchored there), so anything but 'digits:digits' entries between
    -- commas is refused, and + 0 below cannot fail. Starts stay below
    -- 2^53 / 1000 so that start × buckets is exact. Starts never go back, so
    -- the sub-windows out of this one's window come first and are skipped;
    -- after an interval change two may share an index, and are merged.
    local start, at, n, bad = 0, 1, #v, string.byte(v, -1) == 44 -- a trailing ','
    while at <= n and not bad do
      local _, e, since, count = string.find(v, '^(%d+):(%d+),?', at)
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
      corrupt(s.where, 'field counts' .. s.K .. ' = ' .. string.format('%q', v))
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
  s.live, s.total, s.current = live, total, current
end

-- wait: enough of the oldest sub-windows must leave the window: the one
-- that frees the last permit needed leaves when sub-window index + buckets
-- begins (index × interval / buckets ms, rounded up).
function sliding.wait(s, permits, now)
  local need = s.total + permits - s.rate
  if need <= 0 then
    return 0
  end
  local live, freed = s.live, 0
  for i = 1, #live, 3 do
    freed = freed + live[i + 1]
    if freed >= need then
      local leaves = (live[i] + s.buckets) * s.interval / s.buckets
      return (leaves + (-leaves) % 1) * 1000 - now
    end
  end
  return s.interval * 1000 -- not reached: permits <= rate, so the window holds enough to free
end

-- commit counts a grant in this sub-window; the state's expiry moves only
-- when the sub-window is new. It refuses (false) a count doubles do not
-- hold exactly: 2^53 or more.
function sliding.commit(s, permits)
  if s.total + permits >= MAX then
    return false
  end
  local live, current = s.live, s.current
  if #live == 0 or live[#live - 2] ~= current then
    local start = current * s.interval / s.buckets
    live[#live + 1] = current
    live[#live + 1] = 0
    live[#live + 1] = start + (-start) % 1
    s.moved = true
  end
  live[#live - 1] = live[#live - 1] + permits
  s.total = s.total + permits
  return true
end

-- encode writes the sub-windows that still count, as the field keeps them;
-- none, and the field goes. Numbers below 10^14 concatenate exactly (Redis
-- formats them with %.14g): starts in ms and their gaps do; a count may not.
function sliding.encode(s)
  local live, value, before = s.live, nil, 0
  for i = 1, #live, 3 do
    if live[i + 1] > 0 then
      local count = live[i + 1]
      if count >= 1e14 then count = string.format('%d', count) end
      local entry = (live[i + 2] - before) .. ':' .. count
      if value then value = value .. ',' .. entry else value = entry end
      before = live[i + 2]
    end
  end
  return s.moved, value
end

-- report: full again when the newest sub-window leaves the window.
function sliding.report(s, now)
  local live, reset = s.live, 0
  if #live > 0 then
    local leaves = (live[#live - 2] + s.buckets) * s.interval / s.buckets
    reset = (leaves + (-leaves) % 1) * 1000 - now
  end
  return s.rate - s.total, reset
end

-- Beyond the common decision (the lean script leaves these out):
--[[@rare]]

-- release gives back a grant's permits from its own sub-window only, while
-- it still counts: a newer one's count would outlive them. Those it empties
-- go, so the state may expire sooner.
function sliding.release(s, permits, at)
  local live = s.live
  local of = (at - at % 1000) / 1000 * s.buckets / s.interval
  of = of - of % 1
  local back = 0
  for i = #live - 2, 1, -3 do
    if live[i] == of then
      back = math.min(permits, live[i + 1])
      live[i + 1] = live[i + 1] - back
      break
    end
  end
  while #live > 0 and live[#live - 1] == 0 do
    table.remove(live)
    table.remove(live)
    table.remove(live)
  end
  s.total, s.moved = s.total - back, true
  return back
end

-- room is what a settle may count and leave at most debt permits over the
-- rate; nil without a cap.
function sliding.room(s, debt)
  if not debt then
    return nil
  end
  return s.rate - s.total + debt
end

-- extend counts a reservation's cost past its grant in the grant's own
-- sub-window while it still counts (the cost leaves with the grant), else
-- in now's, as a grant made now. It refuses (false) a count doubles do
-- not hold exactly.
function sliding.extend(s, permits, at)
  if s.total + permits >= MAX then
    return false
  end
  local live = s.live
  local of = (at - at % 1000) / 1000 * s.buckets / s.interval
  of = of - of % 1
  for i = #live - 2, 1, -3 do
    if live[i] == of then
      live[i + 1], s.total = live[i + 1] + permits, s.total + permits
      return true
    end
  end
  return sliding.commit(s, permits)
end

return sliding
