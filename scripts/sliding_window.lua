-- Sliding window counters: the interval split into buckets sub-windows, aligned
-- to the Unix epoch; a decision sums the last `buckets` sub-windows, so no span
-- shorter than interval × (buckets − 1) / buckets holds more than rate grants.
-- State key: a hash {sub-window start in ms = permits granted in it}; stale
-- fields are dropped as they age and the key expires when the last one would.
-- Fields hold starts, not indexes, so they keep their place in time across an
-- interval change.
-- allow replies {allowed, limit, remaining, retry after µs, reset after µs}.

-- starts returns when sub-window index begins, in µs (index × interval / buckets, in whole ms).
local function starts(cfg, index)
  return math.ceil(index * cfg.interval / cfg.buckets) * 1000
end

-- load returns the current sub-window's index, the live sub-windows sorted
-- oldest first as {index, count, field} triples, their total, and the stale
-- fields. Time never goes back: a request whose clock is behind the newest
-- sub-window (clocks that disagree under WithClock, or a request that reached
-- Redis late) is decided as of that sub-window, so nothing it would have
-- counted has been dropped as stale already.
local function load(cfg, key)
  local flat = call(key, 'HGETALL', key)
  local current = math.floor(NOW_MS * cfg.buckets / cfg.interval)
  local subs = {}
  for i = 1, #flat, 2 do
    local start = integer(key, 'sub-window', flat[i], 0, MAX / 1000) -- × buckets stays below 2^53
    local index = math.floor(start * cfg.buckets / cfg.interval)
    subs[#subs + 1] = { index, integer(key, flat[i], flat[i + 1], 0, MAX), flat[i] }
    current = math.max(current, index)
  end
  local live, stale, total = {}, {}, 0
  for _, sub in ipairs(subs) do
    if sub[1] <= current - cfg.buckets then
      stale[#stale + 1] = sub[3]
    else
      live[#live + 1] = sub
      total = total + sub[2]
    end
  end
  table.sort(live, function(a, b) return a[1] < b[1] end)
  return current, live, total, stale
end

-- reset_after is when the newest live sub-window leaves the window.
local function reset_after(cfg, live)
  if #live == 0 then
    return 0
  end
  return starts(cfg, live[#live][1] + cfg.buckets) - NOW_US
end

local function store(cfg, key, live, stale)
  if #stale > 0 then
    redis.call('HDEL', key, unpack(stale))
  end
  local reset = reset_after(cfg, live)
  if reset > 0 then
    redis.call('PEXPIRE', key, expiry(cfg, reset / 1000))
  else
    redis.call('DEL', key)
  end
end

-- retry_after finds when enough of the oldest sub-windows have left the window.
local function retry_after(cfg, live, need)
  local freed = 0
  for _, sub in ipairs(live) do
    freed = freed + sub[2]
    if freed >= need then
      return starts(cfg, sub[1] + cfg.buckets) - NOW_US
    end
  end
  return cfg.interval * 1000
end

local function allow(cfg, keys, permits)
  local key = keys[1]
  local current, live, total, stale = load(cfg, key)
  local allowed, retry = 0, 0
  if permits > cfg.rate then
    retry = -1
  elseif total + permits <= cfg.rate then
    allowed = 1
    if permits > 0 and first_run() then -- a re-run's grant is counted already
      local field = starts(cfg, current) / 1000
      redis.call('HINCRBY', key, field, permits)
      if #live == 0 or live[#live][1] ~= current then
        live[#live + 1] = { current, 0, field }
      end
      live[#live][2] = live[#live][2] + permits
      total = total + permits
      store(cfg, key, live, stale)
      touch(cfg)
    end
  elseif permits > 0 and replayed() then
    allowed = 1
  else
    retry = retry_after(cfg, live, total + permits - cfg.rate)
  end
  return { allowed, cfg.rate, math.max(0, cfg.rate - total), retry, reset_after(cfg, live) }
end

-- release takes permits back from the newest sub-windows first.
local function release(cfg, keys, permits)
  local key = keys[1]
  if not first_run() then
    return 0
  end
  local _, live, _, stale = load(cfg, key)
  local left = permits
  for i = #live, 1, -1 do
    if left == 0 then break end
    local back = math.min(left, live[i][2])
    redis.call('HINCRBY', key, live[i][3], -back)
    live[i][2] = live[i][2] - back
    left = left - back
    if live[i][2] == 0 then
      redis.call('HDEL', key, live[i][3])
      table.remove(live, i)
    end
  end
  store(cfg, key, live, stale)
  return permits - left
end

local TYPES = { 'hash' }
local settle = nil
