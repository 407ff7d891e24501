-- Helpers of the admin and in-flight scripts (internal/evalsha puts this
-- file before each, after fail.lua).

-- call runs a command on key and turns an error into a clear one naming the
-- key and the command (Redis before 7.2 names no command in an ACL refusal).
local function call(key, command, ...)
  local reply = redis.pcall(command, ...)
  if type(reply) == 'table' and reply.err then
    corrupt(key, reply.err .. ' (' .. command .. ')')
  end
  return reply
end

-- integer parses a stored field: a whole number within [min, max], or nil when absent.
local function integer(key, field, value, min, max)
  if not value then
    return nil
  end
  local n = tonumber(value)
  if n == nil or n % 1 ~= 0 or n < min or n > max then
    corrupt(key, 'field ' .. field .. ' = ' .. string.format('%q', value))
  end
  return n
end
