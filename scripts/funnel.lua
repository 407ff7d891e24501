-- Funnel: GCRA as redis-cell's CL.THROTTLE computes it, in microseconds.
-- State key: tat, the theoretical arrival time in µs; it expires when the
-- funnel is empty again. Rate permits drain per interval; burst is the capacity.
-- allow replies {allowed, limit, remaining, retry after µs, reset after µs}.

local function emission(cfg)
  return math.floor(cfg.interval * 1000 / cfg.rate)
end

-- load returns the stored TAT, never before now nor beyond a full funnel (the
-- usage a rate decrease leaves behind is clamped to the new capacity).
local function load(cfg, key, tolerance)
  local tat = integer(key, 'tat', call(key, 'GET', key), 0, MAX) or NOW_US
  return math.min(math.max(tat, NOW_US), NOW_US + tolerance)
end

local function store(cfg, key, tat)
  if tat <= NOW_US then
    redis.call('DEL', key)
  else
    redis.call('SET', key, tat, 'PX', expiry(cfg, (tat - NOW_US) / 1000))
  end
end

local function allow(cfg, keys, permits)
  local key = keys[1]
  local interval = emission(cfg)
  local tolerance = interval * cfg.burst
  local tat = load(cfg, key, tolerance)
  local increment = interval * permits
  if permits > 0 and replayed() then
    increment = 0 -- a re-sent request: its grant is already in the TAT
  end
  local new_tat = tat + increment
  local allowed_at = new_tat - tolerance
  local allowed, retry, ttl = 1, 0, new_tat - NOW_US
  if NOW_US < allowed_at then
    allowed, ttl = 0, tat - NOW_US
    retry = allowed_at - NOW_US
    if increment > tolerance then
      retry = -1
    end
  elseif increment > 0 then
    store(cfg, key, new_tat)
    remember_request()
    touch(cfg)
  end
  local remaining = 0
  if tolerance - ttl > -interval then
    remaining = math.floor((tolerance - ttl) / interval)
  end
  return { allowed, cfg.burst, math.max(0, remaining), retry, ttl }
end

local function release(cfg, keys, permits)
  local key = keys[1]
  if replayed() then
    return 0
  end
  local interval = emission(cfg)
  local tat = load(cfg, key, interval * cfg.burst)
  local back = math.min(permits, math.floor((tat - NOW_US) / interval))
  store(cfg, key, tat - back * interval)
  remember_request()
  return back
end

return run({ name = 'funnel', keys = 1, types = { 'string' }, allow = allow, release = release })
