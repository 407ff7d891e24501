-- Funnel: GCRA as redis-cell's CL.THROTTLE computes it, in microseconds.
-- Rate permits drain per interval and burst is the capacity; the state
-- expires when the funnel is empty again.
-- The emission interval, interval × 1000 / rate µs, is seldom whole
-- (PerSecond(600000): 5/3 µs), and a floored one drains faster than the
-- rate says. So every time is whole µs plus a remainder in 1/rate µs, and
-- every step is exact.
-- State: field tat, the theoretical arrival time, as 'µs' or 'µs,remainder'
-- (a flat state: the same string), then ',1' while it is owed: a charge
-- (Limiter.Charge) took it past a full funnel. A TAT without a remainder (as
-- scripts before remainders wrote it) has remainder 0; a remainder of rate
-- or more (kept from another rate by SetRate) rounds the TAT up to the next
-- µs.
-- A module of decide.lua: see there for what each function is given.

-- times returns m emission intervals of pe + pr / rate µs, as whole µs and a
-- remainder in 1/rate µs. Where m × pr passes 2^52 (doubles are exact to
-- 2^53) it is summed digit by digit of m in base b, a power of 2 small
-- enough that every partial sum stays below 2^52.
local function times(m, pe, pr, rate)
  local x = m * pr
  if x < 4503599627370496 then
    local f = x % rate
    return m * pe + (x - f) / rate, f
  end
  local w, b, top, q, f = m * pe, 1, 1, 0, 0
  while b * 2 * rate <= 2251799813685248 do b = b * 2 end
  while top * b <= m do top = top * b end
  while top >= 1 do
    local digit = (m - m % top) / top
    local y = f * b + digit * pr
    f = y % rate
    m, q, top = m % top, q * b + (y - f) / rate, top / b
  end
  return w + q, f
end

-- count returns how many whole emission intervals fit in w µs plus f / rate
-- µs: floor((w × rate + f) / (pe × rate + pr)), for w ≥ 0 and f < rate.
local function count(w, f, pe, pr, rate)
  if pr == 0 then
    return (w - w % pe) / pe -- f / rate is less than 1µs, pe whole µs
  end
  local period, x = pe * rate + pr, w * rate + f
  if x < 4503599627370496 then
    return (x - x % period) / period
  end
  -- Doubles put the count within a few of the truth; exact steps end it.
  local k = x / period
  k = k - k % 1
  local kw, kf = times(k, pe, pr, rate)
  while kw > w or kw == w and kf > f do
    k, kw, kf = k - 1, kw - pe, kf - pr
    if kf < 0 then kw, kf = kw - 1, kf + rate end
  end
  while true do
    local nw, nf = kw + pe, kf + pr
    if nf >= rate then nw, nf = nw + 1, nf - rate end
    if nw > w or nw == w and nf > f then
      return k
    end
    k, kw, kf = k + 1, nw, nf
  end
end

local funnel = {}

function funnel.capacity(s)
  return s.burst
end

-- load reads the stored TAT (tat + tatf / rate µs), clamped to now at the
-- earliest, and to a full funnel at the latest (the usage a rate decrease
-- leaves behind fits the new capacity), unless it is owed: a charge's debt
-- drains, to the µs, before anything more is granted. The emission interval
-- is pe + pr / rate µs, the tolerance (burst of them) tolerance + tf / rate.
function funnel.load(s, v, _, now)
  local rate = s.rate
  local pe = s.interval * 1000 / rate
  pe = pe - pe % 1
  local pr = s.interval * 1000 - pe * rate
  local tolerance, tf = times(s.burst, pe, pr, rate)
  s.pe, s.pr, s.tolerance, s.tf = pe, pr, tolerance, tf
  local tat, tatf = now, 0
  if v then
    local t, f, owed = string.match(v, '^(%d+),?(%d*),?(1?)$')
    tat = t and t + 0
    if not tat or tat > MAX then
      corrupt(s.where, 'field tat' .. s.K .. ' = ' .. string.format('%q', v))
    end
    if f ~= '' then
      tatf = f + 0
      if tatf >= rate then tat, tatf = tat + 1, 0 end
    end
    if tat < now then
      tat, tatf = now, 0
    elseif (tat - now > tolerance or tat - now == tolerance and tatf > tf) and owed == '' then
      tat, tatf = now + tolerance, tf
    end
  end
  s.tat, s.tatf = tat, tatf
end

-- wait: permits fit when tat + permits × emission ≤ now + tolerance; the
-- wait is the exact difference, rounded up to whole µs.
function funnel.wait(s, permits, now)
  local w, f = times(s.burst - permits, s.pe, s.pr, s.rate)
  local wait = s.tat - now - w
  if s.tatf > f then wait = wait + 1 end
  return wait
end

-- commit counts a grant. It drains from the TAT before it (whole µs,
-- rounded down): since, which a reservation's release reckons from. It
-- refuses (false) a debt past what the state holds exactly: a TAT more
-- than MAX_DEBT µs ahead of now.
function funnel.commit(s, permits, now)
  s.since = s.tat
  local w, f = times(permits, s.pe, s.pr, s.rate)
  local tat, tatf = s.tat + w, s.tatf + f
  if tatf >= s.rate then tat, tatf = tat + 1, tatf - s.rate end
  if tat - now > MAX_DEBT then
    return false
  end
  s.tat, s.tatf = tat, tatf
  return true
end

-- encode returns whether the state's expiry moves (on every write), and
-- its field: none for an empty funnel. A TAT past a full funnel is a
-- charge's debt.
function funnel.encode(s, now)
  local tat, tatf = s.tat, s.tatf
  if tat - now > s.tolerance or tat - now == s.tolerance and tatf > s.tf then
    return true, string.format('%d,%d,1', tat, tatf)
  elseif tatf > 0 then
    return true, string.format('%d,%d', tat, tatf)
  elseif tat > now then
    return true, string.format('%d', tat)
  end
  return true, nil
end

-- report: µs until the funnel is empty, rounded up; and the permits that
-- fit now: the whole emission intervals in tolerance − (TAT − now), never
-- below 0.
function funnel.report(s, now)
  local reset = s.tat - now
  local w, f = s.tolerance - reset, s.tf - s.tatf
  if f < 0 then w, f = w - 1, f + s.rate end
  local x, remaining = w * s.rate + f, 0
  if x >= 4503599627370496 then
    remaining = count(w, f, s.pe, s.pr, s.rate)
  elseif x >= 0 then
    local period = s.interval * 1000
    remaining = (x - x % period) / period -- count's common case
  end
  if s.tatf > 0 then reset = reset + 1 end
  return remaining, reset
end

-- Beyond the common decision (the lean script leaves these out):
--[[@rare]]

-- release gives back up to permits of a grant of size permits made at at
-- µs (since, when it was a funnel's): what has not drained of it,
-- at + size × emission − now, in whole emission intervals, and never more
-- than the TAT holds. Whatever came between, the TAT is then no lower than
-- without those permits.
function funnel.release(s, permits, at, size, now)
  local rate, pe, pr = s.rate, s.pe, s.pr
  local back = count(s.tat - now, s.tatf, pe, pr, rate)
  if back > permits then back = permits end
  local w, f = times(size, pe, pr, rate)
  w = w + at - now
  local left = w >= 0 and count(w, f, pe, pr, rate) or 0
  if left < back then back = left end
  w, f = times(back, pe, pr, rate)
  local tat, tatf = s.tat - w, s.tatf - f
  if tatf < 0 then tat, tatf = tat - 1, tatf + rate end
  s.tat, s.tatf = tat, tatf
  return back
end

-- room is what a settle may count and leave at most debt permits owed:
-- debt + floor((now + tolerance − TAT) / emission), the floor negative
-- while the funnel is owed; nil without a cap.
function funnel.room(s, debt, now)
  if not debt then
    return nil
  end
  local rate, pe, pr = s.rate, s.pe, s.pr
  local w, f = s.tolerance - (s.tat - now), s.tf - s.tatf
  if f < 0 then w, f = w - 1, f + rate end
  if w >= 0 then
    return debt + count(w, f, pe, pr, rate)
  end
  -- Owed: −(w + f / rate) µs, in emission intervals rounded up.
  if f > 0 then w, f = w + 1, rate - f else w, f = w, 0 end
  local k = count(-w, f, pe, pr, rate)
  local kw, kf = times(k, pe, pr, rate)
  if kw ~= -w or kf ~= f then k = k + 1 end
  return debt - k
end

-- extend counts a reservation's cost past its grant: the grant's place in
-- the funnel while it has not drained (what follows it moves back), else
-- from now, as a grant made now; both are the TAT's move by permits
-- emission intervals. It refuses (false) a debt past what the state holds.
function funnel.extend(s, permits, _, _, now)
  return funnel.commit(s, permits, now)
end

return funnel
