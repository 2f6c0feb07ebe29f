"""The Lua scripts a Redis store runs (`redis_store`): each takes, checks or seeds every bucket
of a request in one call, atomically, on Redis's clock. Strings alone: no I/O."""

from __future__ import annotations

from dragoman.limits.credit import HALF, HOLD

# ARGV[1]: n, the buckets to take from (the first n KEYS); the other KEYS are settled first.
# ARGV[2]: at most this many more of each cost taken, where every bucket keeps more than HALF of
# what it can give (above need - cost, the lowest level a take may leave) after, and the more
# taken is at most HOLD of that (credit.py); negative, a take ahead (`redis_store._ask_ahead`): for no
# request, its own share is credit too, so that counts in HOLD, and where there is no room for
# it nothing is taken. Then 5 ARGV per bucket taken from (capacity, refill per ms, cost, need,
# ttl ms), then 4 per bucket settled (capacity, refill per ms, ttl ms, delta: the first three are
# the same each time, encoded once). Returns {admitted, level..., extra} with the levels as
# strings (Lua numbers would come back truncated).
STEP = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local function level(key, cap, rate)
  local state = redis.call('HMGET', key, 't', 'at')
  if not state[1] then return cap end
  return math.min(cap, tonumber(state[1]) + (now - tonumber(state[2])) * rate)
end
local function store(key, tokens, ttl)
  redis.call('HSET', key, 't', tostring(tokens), 'at', now)
  redis.call('PEXPIRE', key, ttl)
end
local n, extra = tonumber(ARGV[1]), tonumber(ARGV[2])
local ahead = extra < 0
if ahead then extra = -extra end
local a = 3 + n * 5
for i = n + 1, #KEYS do
  local cap, rate = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  store(KEYS[i], math.min(cap, level(KEYS[i], cap, rate) + tonumber(ARGV[a + 3])), ARGV[a + 2])
  a = a + 4
end
local levels, admitted = {}, 1
for i = 1, n do
  local b = 3 + (i - 1) * 5
  local cap, cost, need = tonumber(ARGV[b]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  levels[i] = level(KEYS[i], cap, tonumber(ARGV[b + 1]))
  if levels[i] < need then admitted = 0 end
  local floor = need - cost  -- the lowest level a take may leave (credit.kept); a budget's is far above 0
  local room = math.min(levels[i] - cost - floor - (cap - floor) * HALF, (cap - floor) * HOLD - (ahead and cost or 0))
  if room < 0 then
    extra = 0
    if ahead then admitted = 0 end
  elseif cost > 0 then extra = math.min(extra, math.floor(room / cost)) end
end
if admitted == 0 then extra = 0 end
local reply = {admitted}
for i = 1, n do
  local b = 3 + (i - 1) * 5
  if admitted == 1 then
    levels[i] = levels[i] - tonumber(ARGV[b + 2]) * (1 + extra)
    store(KEYS[i], levels[i], ARGV[b + 4])
  end
  reply[i + 1] = tostring(levels[i])
end
reply[n + 2] = extra
return reply
""".replace("HALF", repr(HALF)).replace("HOLD", repr(HOLD))


# KEYS: buckets to start where Redis holds nothing for them; 3 ARGV each (capacity, delta, ttl ms).
SEED = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
for i = 1, #KEYS do
  local a = (i - 1) * 3 + 1
  if redis.call('EXISTS', KEYS[i]) == 0 then
    redis.call('HSET', KEYS[i], 't', tostring(math.min(tonumber(ARGV[a]), tonumber(ARGV[a]) + tonumber(ARGV[a + 1]))), 'at', now)
    redis.call('PEXPIRE', KEYS[i], ARGV[a + 2])
  end
end
return #KEYS
"""
