-- Fixed window: at most rate permits per window of interval, windows aligned
-- to the Unix epoch so every instance agrees where one starts.
-- State: fields window (its start in ms) and count (permits granted in it);
-- they expire with their window.

algorithm.fields = { 'window', 'count' }
algorithm.types = { 'hash' }

-- load finds the current window. Windows never go back: a request whose clock
-- is behind the stored window's (clocks that disagree under WithClock, or a
-- request that reached Redis late) counts in the stored window rather than
-- resetting it. The start is kept in ms, not as an index, so that it stays
-- meaningful across an interval change.
function algorithm.load(cfg, where, stored_start, stored_count)
  local window = NOW_MS - NOW_MS % cfg.interval
  local s = { where = where, start = window, count = 0 }
  if stored_start or stored_count then
    local start = integer(where, 'window', stored_start, 0, MAX)
    local count = integer(where, 'count', stored_count, 0, MAX)
    if start == nil or count == nil then
      fail('corrupt ' .. where .. ': half a window')
    end
    s.stored = start
    start = start - start % cfg.interval
    if start >= window then
      s.start, s.count = start, count
    end
  end
  s.ends = (s.start + cfg.interval) * 1000
  return s
end

function algorithm.wait(cfg, s, permits)
  if s.count + permits <= cfg.rate then
    return 0
  end
  return s.ends - NOW_US
end

-- store writes the window, setting the key's expiry only when the window is
-- new: within one, a grant adds to the count and nothing else.
local function store(cfg, s, permits)
  if s.count <= 0 then
    redis.call('HDEL', s.where, 'window', 'count')
  elseif s.start ~= s.stored then
    save(cfg, s.where, s.ends - NOW_US, 'window', s.start, 'count', s.count)
  else
    redis.call('HINCRBY', s.where, 'count', permits)
  end
end

function algorithm.commit(cfg, s, permits)
  s.count = s.count + permits
  store(cfg, s, permits)
  return true
end

function algorithm.report(cfg, s)
  if s.count == 0 then
    return cfg.rate, 0
  end
  return cfg.rate - s.count, s.ends - NOW_US
end

function algorithm.release(cfg, s, permits)
  local back = math.min(permits, s.count)
  s.count = s.count - back
  store(cfg, s, -back)
  return back
end
