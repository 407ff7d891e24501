-- Fixed window: at most rate permits per window of interval, windows aligned to
-- the Unix epoch so every instance agrees where one starts.
-- State key: a hash {w = window index, n = permits granted in it} that expires
-- with its window.
-- allow replies {allowed, limit, remaining, retry after µs, reset after µs}.

-- load returns the current window's index, its end in µs, and its count.
local function load(cfg, key)
  local window = math.floor(NOW_MS / cfg.interval)
  local ends = (window + 1) * cfg.interval * 1000
  local f = call(key, 'HMGET', key, 'w', 'n')
  local w, n = integer(key, 'w', f[1], 0, MAX), integer(key, 'n', f[2], 0, MAX)
  if (w == nil) ~= (n == nil) then
    fail('corrupt ' .. key .. ': half a window')
  end
  local count = 0
  if w == window then
    count = n
  end
  return window, ends, count
end

local function store(cfg, key, window, ends, count)
  if count <= 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'w', window, 'n', count)
    redis.call('PEXPIRE', key, expiry(cfg, (ends - NOW_US) / 1000))
  end
end

local function allow(cfg, keys, permits)
  local key = keys[1]
  local window, ends, count = load(cfg, key)
  local allowed, retry = 0, 0
  if permits > cfg.rate then
    retry = -1
  elseif count + permits <= cfg.rate then
    allowed = 1
    if permits > 0 and first_run() then -- a re-run's grant is counted already
      count = count + permits
      store(cfg, key, window, ends, count)
      touch(cfg)
    end
  elseif permits > 0 and replayed() then
    allowed = 1
  else
    retry = ends - NOW_US
  end
  local reset = 0
  if count > 0 then
    reset = ends - NOW_US
  end
  return { allowed, cfg.rate, math.max(0, cfg.rate - count), retry, reset }
end

local function release(cfg, keys, permits)
  local key = keys[1]
  if not first_run() then
    return 0
  end
  local window, ends, count = load(cfg, key)
  local back = math.min(permits, count)
  store(cfg, key, window, ends, count - back)
  return back
end

local TYPES = { 'hash' }
local settle = nil
