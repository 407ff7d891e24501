-- What every decision, admin and in-flight script begins with (the
-- assembler, internal/evalsha, puts it there once for each).

local MAX = 9007199254740992 -- 2^53: doubles are exact integers below it

-- fail raises the error the client maps to a sentinel (internal/wire's
-- error prefixes): plain strings at level 0 (no position), which Redis and
-- miniredis wrap each their own way.
local function fail(why)
  error('REDLIMIT ' .. why, 0)
end

local function corrupt(key, what)
  fail(E_CORRUPT .. ' ' .. key .. ': ' .. what)
end
