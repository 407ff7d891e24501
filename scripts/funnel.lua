-- Funnel: GCRA as redis-cell's CL.THROTTLE computes it, in microseconds.
-- State: field tat, the theoretical arrival time in µs (a flat state: the
-- same number alone). Rate permits drain
-- per interval and burst is the capacity; the state expires when the funnel
-- is empty again. Sections: see common.lua.

--[[@helpers]]

--[[@fields]]
, 'tat' .. K
--[[@capacity]]
burst
--[[@load]]
-- The stored TAT is clamped to now at the earliest, and to a full funnel at
-- the latest (the usage a rate decrease leaves behind fits the new capacity).
local emission = interval * 1000 / rate
emission = emission - emission % 1
local tolerance = emission * burst
local tat = NOW_US
if s1 then
  tat = tonumber(s1)
  if not tat or tat % 1 ~= 0 or tat < 0 or tat > MAX then
    error('REDLIMIT corrupt ' .. where .. ': field tat' .. K .. ' = ' .. string.format('%q', s1), 0)
  end
  if tat < NOW_US then
    tat = NOW_US
  elseif tat > NOW_US + tolerance then
    tat = NOW_US + tolerance
  end
end
--[[@wait]]
wait = tat + emission * permits - tolerance - NOW_US
--[[@commit]]
tat = tat + emission * permits
--[[@resent]]
false
--[[@report]]
reset = tat - NOW_US
if tolerance - reset > -emission then
  remaining = (tolerance - reset) / emission
  remaining = remaining - remaining % 1
end
--[[@release]]
back = math.min(permits, math.floor((tat - NOW_US) / emission))
tat = tat - back * emission
--[[@decode]]
s1 = flat
--[[@encode]]
-- An empty funnel has no state; every other moves its expiry.
value = tat > NOW_US and string.format('%d', tat) or nil
expire = value ~= nil
--[[@write]]
if value then
  redis.call('HSET', where, 'tat' .. K, value)
else
  redis.call('HDEL', where, 'tat' .. K)
end
--[[@admin]]
local TYPES, FIELDS, settle = { 'hash' }, { 'tat' }, nil
