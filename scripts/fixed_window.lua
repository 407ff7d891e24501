-- Fixed window: at most rate permits per window of interval, windows aligned
-- to the Unix epoch so every instance agrees where one starts; or, for a
-- calendar rate, the calendar's windows, whose edges Go sends (calendar.go).
-- State: fields window (its start in ms) and count (permits granted in it),
-- or a flat state 'window count'; they expire with their window.
-- A module of decide.lua: see there for what each function is given.

local window = {}

function window.capacity(s)
  return s.rate
end

-- load finds the window that holds now and the count it holds. Windows never
-- go back: a request whose clock is behind the stored window's (clocks that
-- disagree under WithClock, or a request that reached Redis late) counts in
-- the stored window rather than resetting it. The start is kept in ms, not
-- as an index, so that it stays meaningful across an interval change. A
-- calendar rate's window is the one of the three Go sent (s.edges) that
-- holds now, and its interval that window's length; clocks a whole window
-- apart refuse.
function window.load(s, v1, v2, now)
  local now_ms = (now - now % 1000) / 1000
  local interval, edges = s.interval, s.edges
  local start, count = now_ms - now_ms % interval, 0
  if edges then
    start = nil
    for e = 1, 3 do
      if now_ms >= edges[e] and now_ms < edges[e + 1] then
        start, interval = edges[e], edges[e + 1] - edges[e]
      end
    end
    if not start then
      fail(E_CLOCK .. string.format(' at %d ms is outside the calendar windows the client sent, %d to %d ms',
        now_ms, edges[1], edges[4]))
    end
  end
  s.stored_start = nil
  if v1 or v2 then
    local stored_start, stored_count = tonumber(v1 or ''), tonumber(v2 or '')
    if not (stored_start and stored_count and stored_start % 1 + stored_count % 1 == 0
          and stored_start >= 0 and stored_start <= MAX and stored_count >= 0 and stored_count <= MAX) then
      corrupt(s.where, 'fields window' .. s.K .. ', count' .. s.K .. ' = '
        .. string.format('%q, %q', v1 or 'none', v2 or 'none'))
    end
    s.stored_start = stored_start
    if edges and stored_start >= start then
      -- Counted in now's window or a later one (see above), as a start of
      -- another calendar's may be (SetRate keeps the usage): in the one
      -- that holds it.
      if stored_start >= edges[3] then
        start, interval = edges[3], edges[4] - edges[3]
      end
      count = stored_count
    elseif not edges and stored_start - stored_start % interval >= start then
      start, count = stored_start - stored_start % interval, stored_count
    end
  end
  s.start, s.count, s.length = start, count, interval
  s.ends = (start + interval) * 1000
end

function window.wait(s, permits, now)
  if s.count + permits > s.rate then
    return s.ends - now
  end
  return 0
end

-- commit refuses (false) a count doubles do not hold exactly: 2^53 or more.
function window.commit(s, permits)
  if s.count + permits >= MAX then
    return false
  end
  s.count = s.count + permits
  return true
end

-- encode: a new window's first write moves the state's expiry; the others
-- keep it.
function window.encode(s)
  if s.count <= 0 then
    return false, nil, nil
  end
  return s.start ~= s.stored_start, string.format('%d', s.start), string.format('%d', s.count)
end

function window.report(s, now)
  local reset = 0
  if s.count > 0 then
    reset = s.ends - now
  end
  return s.rate - s.count, reset
end

-- Beyond the common decision (the lean script leaves these out):
--[[@rare]]

-- release gives back a grant's permits only while its window lasts: one
-- ended has taken them with it.
function window.release(s, permits, at)
  if at < s.start * 1000 then
    return 0
  end
  local back = math.min(permits, s.count)
  s.count = s.count - back
  return back
end

-- room: a window holds no debt (it would forgive it at its end), so a
-- settle counts no more than its rate leaves, whatever cap it was given.
function window.room(s)
  return s.rate - s.count
end

-- extend counts a reservation's cost past its grant in the grant's window
-- while it lasts, else in now's: the work's cost is owed to the window it
-- is known in, never forgiven. Either is the window load found.
function window.extend(s, permits)
  return window.commit(s, permits)
end

return window
