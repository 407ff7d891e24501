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
  local allowed_at = tat + increment - tolerance
  local allowed, retry, ttl = 1, 0, tat - NOW_US
  if NOW_US < allowed_at then
    if not (permits > 0 and replayed()) then -- a re-run of a grant reports it, counting nothing
      allowed, retry = 0, allowed_at - NOW_US
      if increment > tolerance then
        retry = -1
      end
    end
  elseif increment > 0 and first_run() then
    ttl = ttl + increment
    store(cfg, key, tat + increment)
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
  if not first_run() then
    return 0
  end
  local interval = emission(cfg)
  local tat = load(cfg, key, interval * cfg.burst)
  local back = math.min(permits, math.floor((tat - NOW_US) / interval))
  store(cfg, key, tat - back * interval)
  return back
end

local TYPES = { 'string' }
local settle = nil
