-- Funnel: GCRA as redis-cell's CL.THROTTLE computes it, in microseconds.
-- State: field tat, the theoretical arrival time in µs. Rate permits drain
-- per interval and burst is the capacity; the state expires when the funnel
-- is empty again.

algorithm.fields = { 'tat' }
algorithm.types = { 'hash' }

algorithm.capacity = 'burst'

-- load clamps the stored TAT to now at the earliest, and to a full funnel at
-- the latest (the usage a rate decrease leaves behind fits the new capacity).
function algorithm.load(cfg, where, stored)
  local emission = cfg.interval * 1000 / cfg.rate
  emission = emission - emission % 1
  local tolerance = emission * cfg.burst
  local tat = NOW_US
  if stored then
    tat = integer(where, 'tat', stored, 0, MAX)
    if tat < NOW_US then
      tat = NOW_US
    elseif tat > NOW_US + tolerance then
      tat = NOW_US + tolerance
    end
  end
  return { where = where, emission = emission, tolerance = tolerance, tat = tat }
end

function algorithm.wait(cfg, s, permits)
  return s.tat + s.emission * permits - s.tolerance - NOW_US
end

function algorithm.commit(cfg, s, permits)
  s.tat = s.tat + s.emission * permits
  save(cfg, s.where, s.tat - NOW_US, 'tat', string.format('%d', s.tat))
  return true
end

function algorithm.report(cfg, s)
  local ttl = s.tat - NOW_US
  if s.tolerance - ttl <= -s.emission then
    return 0, ttl
  end
  local remaining = (s.tolerance - ttl) / s.emission
  return remaining - remaining % 1, ttl
end

function algorithm.release(cfg, s, permits)
  local back = math.min(permits, math.floor((s.tat - NOW_US) / s.emission))
  s.tat = s.tat - back * s.emission
  if s.tat <= NOW_US then
    redis.call('HDEL', s.where, 'tat')
  else
    save(cfg, s.where, s.tat - NOW_US, 'tat', string.format('%d', s.tat))
  end
  return back
end
