-- Sliding window counters: the interval split into buckets sub-windows,
-- aligned to the Unix epoch; a decision sums the last `buckets` sub-windows,
-- so no span shorter than interval × (buckets − 1) / buckets holds more than
-- rate grants.
-- State: field counts, the live sub-windows oldest first, each as
-- 'start:count' with start in ms, the first absolute and each next one as
-- the ms since the one before ('1700000000000:3,1000:5'). Starts, not
-- indexes, keep their place in time across an interval change. The state
-- expires when the newest sub-window leaves the window.

algorithm.fields = { 'counts' }
algorithm.types = { 'hash' }

-- start_of returns when sub-window index begins, in ms (index × interval /
-- buckets, rounded up).
local function start_of(cfg, index)
  local start = index * cfg.interval / cfg.buckets
  return start + (-start) % 1
end

-- load returns the live sub-windows as a flat list of {index, count, start}
-- triples, oldest first, their total and the current sub-window's index.
-- Time never goes back: a request whose clock is behind the newest
-- sub-window (clocks that disagree under WithClock, or a request that
-- reached Redis late) is decided as of that sub-window, so nothing it would
-- have counted has been dropped as stale already.
function algorithm.load(cfg, where, counts)
  local current = NOW_MS * cfg.buckets / cfg.interval
  current = current - current % 1
  local stored, start = {}, 0
  if counts then
    -- Digits only, so + 0 below cannot fail; starts stay below 2^53 / 1000
    -- so that start × buckets is exact.
    if string.find(counts, '[^%d:,]') then
      fail('corrupt ' .. where .. ': field counts = ' .. string.format('%q', counts))
    end
    for since, count in string.gmatch(counts, '(%d+):(%d+)') do
      start = start + since
      if start > MAX / 1000 then
        fail('corrupt ' .. where .. ': field counts = ' .. string.format('%q', counts))
      end
      local index = start * cfg.buckets / cfg.interval
      index = index - index % 1
      stored[#stored + 1] = index
      stored[#stored + 1] = count + 0
      stored[#stored + 1] = start
      if index > current then current = index end
    end
  end
  -- Keep the live ones; after an interval change two may share an index.
  local live, total = {}, 0
  for i = 1, #stored, 3 do
    if stored[i] > current - cfg.buckets then
      if #live > 0 and live[#live - 2] == stored[i] then
        live[#live - 1] = live[#live - 1] + stored[i + 1]
        live[#live] = stored[i + 2]
      else
        live[#live + 1] = stored[i]
        live[#live + 1] = stored[i + 1]
        live[#live + 1] = stored[i + 2]
      end
      total = total + stored[i + 1]
    end
  end
  return { where = where, current = current, live = live, total = total }
end

-- reset_after is when the newest live sub-window leaves the window, in µs.
local function reset_after(cfg, s)
  if #s.live == 0 then
    return 0
  end
  return start_of(cfg, s.live[#s.live - 2] + cfg.buckets) * 1000 - NOW_US
end

-- wait finds when enough of the oldest sub-windows have left the window.
function algorithm.wait(cfg, s, permits)
  local need = s.total + permits - cfg.rate
  if need <= 0 then
    return 0
  end
  local freed = 0
  for i = 1, #s.live, 3 do
    freed = freed + s.live[i + 1]
    if freed >= need then
      return start_of(cfg, s.live[i] + cfg.buckets) * 1000 - NOW_US
    end
  end
  return cfg.interval * 1000
end

-- store writes the sub-windows that still count; ttl_us as save's. Numbers
-- below 10^14 concatenate exactly (Redis formats them with %.14g): starts in
-- ms and their gaps do; a count may not.
local function store(cfg, s, ttl_us)
  local counts, before = nil, 0
  for i = 1, #s.live, 3 do
    if s.live[i + 1] > 0 then
      local count = s.live[i + 1]
      if count >= 1e14 then count = string.format('%d', count) end
      local entry = (s.live[i + 2] - before) .. ':' .. count
      if counts then counts = counts .. ',' .. entry else counts = entry end
      before = s.live[i + 2]
    end
  end
  if counts then
    save(cfg, s.where, ttl_us, 'counts', counts)
  else
    redis.call('HDEL', s.where, 'counts')
  end
end

-- commit counts the grant in the current sub-window; the key's expiry moves
-- only when that sub-window is new.
function algorithm.commit(cfg, s, permits)
  local live, ttl = s.live, nil
  if #live == 0 or live[#live - 2] ~= s.current then
    live[#live + 1] = s.current
    live[#live + 1] = 0
    live[#live + 1] = start_of(cfg, s.current)
    ttl = reset_after(cfg, s)
  end
  live[#live - 1] = live[#live - 1] + permits
  s.total = s.total + permits
  store(cfg, s, ttl)
  return true
end

function algorithm.report(cfg, s)
  return cfg.rate - s.total, reset_after(cfg, s)
end

-- release takes permits back from the newest sub-windows first; those it
-- empties go, so the state may expire sooner.
function algorithm.release(cfg, s, permits)
  local live, left = s.live, permits
  for i = #live - 2, 1, -3 do
    if left == 0 then break end
    local back = math.min(left, live[i + 1])
    live[i + 1] = live[i + 1] - back
    left = left - back
  end
  while #live > 0 and live[#live - 1] == 0 do
    table.remove(live)
    table.remove(live)
    table.remove(live)
  end
  store(cfg, s, reset_after(cfg, s))
  return permits - left
end
