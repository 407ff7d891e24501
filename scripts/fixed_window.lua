-- Fixed window: at most rate permits per window of interval, windows aligned to
-- the Unix epoch so every instance agrees where one starts.
-- State key: a hash {w = the window's start in ms, n = permits granted in it}
-- that expires with its window.
-- allow replies {allowed, limit, remaining, retry after µs, reset after µs}.

-- load returns the current window's start in ms, its end in µs, and its count.
-- Windows never go back: a request whose clock is behind the stored window's
-- (clocks that disagree under WithClock, or a request that reached Redis late)
-- counts in the stored window rather than resetting it. The start is kept in
-- ms, not as an index, so that it stays meaningful across an interval change.
local function load(cfg, key)
  local f = call(key, 'HMGET', key, 'w', 'n')
  local w, n = integer(key, 'w', f[1], 0, MAX), integer(key, 'n', f[2], 0, MAX)
  if (w == nil) ~= (n == nil) then
    fail('corrupt ' .. key .. ': half a window')
  end
  local window = math.floor(NOW_MS / cfg.interval)
  local count = 0
  if w ~= nil then
    local stored = math.floor(w / cfg.interval)
    if stored >= window then
      window, count = stored, n
    end
  end
  return window * cfg.interval, (window + 1) * cfg.interval * 1000, count
end

local function store(cfg, key, start, ends, count)
  if count <= 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'w', start, 'n', count)
    redis.call('PEXPIRE', key, expiry(cfg, (ends - NOW_US) / 1000))
  end
end

local function allow(cfg, keys, permits)
  local key = keys[1]
  local start, ends, count = load(cfg, key)
  local allowed, retry = 0, 0
  if permits > cfg.rate then
    retry = -1
  elseif count + permits <= cfg.rate then
    allowed = 1
    if permits > 0 and first_run() then -- a re-run's grant is counted already
      count = count + permits
      store(cfg, key, start, ends, count)
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
  local start, ends, count = load(cfg, key)
  local back = math.min(permits, count)
  store(cfg, key, start, ends, count - back)
  return back
end

local TYPES = { 'hash' }
local settle = nil
