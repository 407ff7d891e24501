-- Funnel: GCRA as redis-cell's CL.THROTTLE computes it, in microseconds.
-- Rate permits drain per interval and burst is the capacity; the state
-- expires when the funnel is empty again. Sections: see common.lua.
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

--[[@helpers]]
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

--[[@fields]]
, 'tat' .. K

--[[@capacity]]
burst

--[[@decode]]
s1 = flat

--[[@load]]
-- The emission interval is pe + pr / rate µs, and the tolerance, burst of
-- them, tolerance + tf / rate µs. The stored TAT (tat + tatf / rate µs) is
-- clamped to now at the earliest, and to a full funnel at the latest (the
-- usage a rate decrease leaves behind fits the new capacity), unless it is
-- owed: a charge's debt drains, to the µs, before anything more is granted.
-- Below 2^52, m × pr is exact and so are the steps from it (the common
-- case, written out here as in wait and commit); times takes the rest.
local pe = interval * 1000 / rate
pe = pe - pe % 1
local pr = interval * 1000 - pe * rate
local tolerance, tf = burst * pe, burst * pr
if tf < 4503599627370496 then
  local f = tf % rate
  tolerance, tf = tolerance + (tf - f) / rate, f
else
  tolerance, tf = times(burst, pe, pr, rate)
end
local tat, tatf = NOW_US, 0
if s1 then
  local t, f, owed = string.match(s1, '^(%d+),?(%d*),?(1?)$')
  tat = t and t + 0
  if not tat or tat > MAX then
    error('REDLIMIT corrupt ' .. where .. ': field tat' .. K .. ' = ' .. string.format('%q', s1), 0)
  end
  if f ~= '' then
    tatf = f + 0
    if tatf >= rate then tat, tatf = tat + 1, 0 end
  end
  if tat < NOW_US then
    tat, tatf = NOW_US, 0
  elseif (tat - NOW_US > tolerance or tat - NOW_US == tolerance and tatf > tf) and owed == '' then
    tat, tatf = NOW_US + tolerance, tf
  end
end

--[[@wait]]
-- Permits fit when tat + permits × emission ≤ now + tolerance: the wait is
-- the exact difference, rounded up to whole µs.
local w, f = (burst - permits) * pe, (burst - permits) * pr
if f < 4503599627370496 then
  local r = f % rate
  w, f = w + (f - r) / rate, r
else
  w, f = times(burst - permits, pe, pr, rate)
end
wait = tat - NOW_US - w
if tatf > f then wait = wait + 1 end

--[[@commit]]
-- The grant drains from the TAT before it (whole µs, rounded down): a
-- refund reckons from there (common.lua's since).
if not since or tat < since then since = tat end
local w, f = permits * pe, permits * pr
if f < 4503599627370496 then
  local r = f % rate
  w, f = w + (f - r) / rate, r
else
  w, f = times(permits, pe, pr, rate)
end
tat, tatf = tat + w, tatf + f
if tatf >= rate then tat, tatf = tat + 1, tatf - rate end

--[[@resent]]
false

--[[@release]]
back = count(tat - NOW_US, tatf, pe, pr, rate)
if back > permits then back = permits end
if grant_at then
  -- A refund gives back only what has not drained of its grant:
  -- grant_at + grant_size × emission − now, in whole emission intervals. Whatever came
  -- between, the TAT is then no lower than without those permits.
  local w, f = times(grant_size, pe, pr, rate)
  w = w + grant_at - NOW_US
  local left = w >= 0 and count(w, f, pe, pr, rate) or 0
  if left < back then back = left end
end
local w, f = times(back, pe, pr, rate)
tat, tatf = tat - w, tatf - f
if tatf < 0 then tat, tatf = tat - 1, tatf + rate end

--[[@encode]]
-- An empty funnel has no state; every other moves its expiry. A TAT past a
-- full funnel is a charge's debt (see the top).
value = nil
if tat - NOW_US > tolerance or tat - NOW_US == tolerance and tatf > tf then
  value = string.format('%d,%d,1', tat, tatf)
elseif tatf > 0 then
  value = string.format('%d,%d', tat, tatf)
elseif tat > NOW_US then
  value = string.format('%d', tat)
end
expire = value ~= nil

--[[@write]]
if value then
  redis.call('HSET', where, 'tat' .. K, value)
else
  redis.call('HDEL', where, 'tat' .. K)
end

--[[@report]]
-- Until the funnel is empty, rounded up; and the permits that fit now: the
-- whole emission intervals in tolerance − (TAT − now), never below 0.
reset = tat - NOW_US
do
  local w, f = tolerance - reset, tf - tatf
  if f < 0 then w, f = w - 1, f + rate end
  local x = w * rate + f
  if x < 0 then
    remaining = 0
  elseif x < 4503599627370496 then
    remaining = (x - x % (interval * 1000)) / (interval * 1000) -- count's common case
  else
    remaining = count(w, f, pe, pr, rate)
  end
end
if tatf > 0 then reset = reset + 1 end

--[[@admin]]
local TYPES, FIELDS, settle = { 'hash' }, { 'tat' }, nil
