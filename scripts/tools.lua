-- The helpers of the admin ops, of a refused decision's diagnosis and of
-- the token bucket's decision. script.go pastes this file after the decision
-- block for an algorithm whose decision needs none of it (its state is
-- fields of KEYS[1]: IN_CONFIG), so that no function is created on its
-- decisions, and before it for the token bucket.

local function fail(why)
  error('REDLIMIT ' .. why, 0)
end

-- call runs a command on key and turns a type error into a clear one naming the key.
local function call(key, ...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    fail('corrupt ' .. key .. ': ' .. reply.err)
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
    fail('corrupt ' .. key .. ': field ' .. field .. ' = ' .. string.format('%q', value))
  end
  return n
end

-- expiry converts a state key's TTL in µs to whole ms, rounding up. For a
-- key other than KEYS[1], it caps the TTL so that no key outlives a stored
-- config (Expire, ExpireAt). The decision block does the same inline.
local function expiry(ttl_us, key)
  local ttl_ms = (ttl_us + (-ttl_us) % 1000) / 1000
  if ttl_ms < 1 then ttl_ms = 1 end
  if key ~= KEYS[1] and stored and keepalive == 0 then
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 and left < ttl_ms then
      return left
    end
  end
  return ttl_ms
end
