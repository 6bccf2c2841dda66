-- One decision about one request for every global rule it matches, in one atomic call
-- (src/ratelimit/redis/mod.rs tells the algorithm and the formulas).
--
-- KEYS[i]  rule i's key: egressd's prefix, then the rule's key with its {hash tag}; the counter
--          of window w is KEYS[i]..':'..w (the same cluster slot as KEYS[i]).
-- ARGV     for rule i, ARGV[2i-1] = requests and ARGV[2i] = period in milliseconds.
-- Returns  three integers per rule: allowed (1 or 0), remaining, reset in milliseconds.
--
-- If every rule allows, every rule's current window counts the request; if one denies, nothing
-- is counted. Lua numbers are doubles: every product below stays under 2^53 (exact), the
-- two that could not (counts times a period) go through muldiv.

-- Milliseconds of the server's clock, which every replica shares.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local SPLIT = 65536

-- floor(x * y / d), exact for integers 0 <= x < 2^36, 0 <= y < 2^27, 1 <= d < 2^36, whatever
-- the size of x * y: x is split in two halves of which each product is exact.
local function muldiv(x, y, d)
  local xh = math.floor(x / SPLIT)
  local xl = x - xh * SPLIT
  local hi = xh * y
  local q1 = math.floor(hi / d)
  local r1 = hi - q1 * d
  if r1 < 0 then
    q1, r1 = q1 - 1, r1 + d
  elseif r1 >= d then
    q1, r1 = q1 + 1, r1 - d
  end
  local rest = r1 * SPLIT + xl * y
  local q2 = math.floor(rest / d)
  local r2 = rest - q2 * d
  if r2 < 0 then
    q2 = q2 - 1
  elseif r2 >= d then
    q2 = q2 + 1
  end
  return q1 * SPLIT + q2
end

-- Milliseconds from elapsed time e of the current window until one more request is allowed,
-- if no other arrives. In this window at the first elapsed t with
-- (cur + 1) * p + prev * (p - t) <= limit * p, that is t >= p - floor((limit - cur - 1) * p / prev);
-- else in the next one, where cur becomes the previous count: t >= p - floor((limit - 1) * p / cur).
local function wait_ms(limit, cur, prev, e, p)
  local room = limit - cur - 1
  if room >= 0 and prev > 0 then
    local t = p - muldiv(room, p, prev)
    if t < p then
      return t - e
    end
  end
  local t = 0
  if cur > 0 then
    t = math.max(0, p - muldiv(limit - 1, p, cur))
  end
  return p - e + t
end

local n = #KEYS
if #ARGV < 2 * n then
  return redis.error_reply('ERR egressd rate limit: 2 arguments per key expected')
end
local now = now_ms()
local window_keys, periods, out = {}, {}, {}
local pending = {}
local all = true
for i = 1, n do
  local limit = tonumber(ARGV[2 * i - 1])
  local p = tonumber(ARGV[2 * i])
  local w = math.floor(now / p)
  local e = now - w * p
  local key = KEYS[i] .. ':' .. string.format('%d', w)
  local cur = tonumber(redis.call('GET', key) or 0) + (pending[key] or 0)
  local prev = tonumber(redis.call('GET', KEYS[i] .. ':' .. string.format('%d', w - 1)) or 0)
  -- floor(limit - estimate) with estimate = prev * (p - e) / p + cur, this request not counted
  local left = limit - cur - prev + muldiv(prev, e, p)
  if left >= 1 then
    pending[key] = (pending[key] or 0) + 1
    out[3 * i - 2], out[3 * i - 1], out[3 * i] = 1, left - 1, p - e
  else
    all = false
    out[3 * i - 2], out[3 * i - 1], out[3 * i] = 0, math.max(left, 0), wait_ms(limit, cur, prev, e, p)
  end
  window_keys[i], periods[i] = key, p
end
for i = 1, n do
  if all then
    if redis.call('INCR', window_keys[i]) == 1 then
      redis.call('PEXPIRE', window_keys[i], 2 * periods[i])
    end
  elseif out[3 * i - 2] == 1 then
    -- Not counted: what it would still let through is one more than had it been.
    out[3 * i - 1] = out[3 * i - 1] + 1
  end
end
return out
