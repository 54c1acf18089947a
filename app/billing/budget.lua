-- Budget spend shared by every replica (app/billing/shared_spend.py). One call covers one
-- scope (a key, or a team): KEYS are, per period of that scope's budgets, a hash and a
-- sorted set, all under one hash tag ({key:alias} or {team:name}), so in a Cluster a
-- call never crosses slots. "Key i" below is the pair KEYS[2i-1], KEYS[2i].
--
-- Per period: the hash with `spent_c` / `spent_t` (settled cost in nano-units, tokens;
-- each settle adds what its request consumed) and `held_c` / `held_t` (in flight), and
-- the sorted set of the holds themselves, "<id> <cost> <tokens>" scored by when they
-- lapse. Each call first drops the holds that lapsed (a settle that never came, a
-- replica that died), then raises `spent` to `base`, the durable spend table as the
-- caller last read it (every replica's flushed spend, a second or two old): a hash Redis
-- lost is rebuilt, a settle lost on the way is made up for once its row is flushed.
-- Holds are per request, so calls may arrive in any order; a replica renews the holds
-- of its requests still running (`renew`), and a renewal of a hold already settled is a
-- no-op. Redis' clock (TIME) times the holds.
--
-- reserve: ARGV = {"reserve", base_c, base_t, unit_c, unit_t, most, id, hold_ms,
--                  then per key: dbase_c, dbase_t, limit_c, limit_t, cap_c, cap_t, ttl_ms}
--          the request asks base + k x unit for an output cap k <= most (limit -1: none;
--          cap 1: that budget lowers k to what fits it, else it refuses what does not)
--          -> {1, k}                                           held at k in every hash
--          -> {0, i, metric (1 cost | 2 tokens), spent, held}  refused by key i
-- resize:  ARGV = {"resize", was_c, was_t, now_c, now_t, id, hold_ms}   -> 1
--          a hold made at `was` becomes `now` (another scope capped the request lower)
-- settle:  ARGV = {"settle", need_c, need_t, actual_c, actual_t, id,
--                  then per key: base_c, base_t, release (1|0), add (1|0), ttl_ms}
--          -> 1
-- renew:   ARGV = {"renew", hold_ms, then per key: n, then its n hold members}
--          -> the number of holds renewed

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local SWEEP = 256  -- lapsed holds dropped per key and call, at most

local function sweep(key, holds)
  local gone = redis.call('ZRANGEBYSCORE', holds, '-inf', now, 'LIMIT', 0, SWEEP)
  for _, member in ipairs(gone) do
    local c, tk = string.match(member, ' (%-?%d+) (%-?%d+)$')
    if c ~= nil and redis.call('ZREM', holds, member) == 1 then
      redis.call('HINCRBY', key, 'held_c', 0 - tonumber(c))
      redis.call('HINCRBY', key, 'held_t', 0 - tonumber(tk))
    end
  end
end

-- lapsed holds dropped, spent raised to base; the key's figures
local function load(key, holds, base_c, base_t)
  sweep(key, holds)
  local v = redis.call('HMGET', key, 'spent_c', 'spent_t', 'held_c', 'held_t')
  local spent_c, spent_t = tonumber(v[1] or '0'), tonumber(v[2] or '0')
  if base_c > spent_c then
    redis.call('HSET', key, 'spent_c', base_c)
    spent_c = base_c
  end
  if base_t > spent_t then
    redis.call('HSET', key, 'spent_t', base_t)
    spent_t = base_t
  end
  return spent_c, spent_t, math.max(0, tonumber(v[3] or '0')), math.max(0, tonumber(v[4] or '0'))
end

local function keep(key, holds, ttl)
  redis.call('PEXPIRE', key, ttl)
  redis.call('PEXPIRE', holds, ttl)
end

local n = #KEYS / 2

local op = ARGV[1]

local function member(id, c, tk)
  return id .. ' ' .. string.format('%.0f', c) .. ' ' .. string.format('%.0f', tk)
end

if op == 'reserve' then
  local base_c, base_t = tonumber(ARGV[2]), tonumber(ARGV[3])
  local unit_c, unit_t = tonumber(ARGV[4]), tonumber(ARGV[5])
  local most = tonumber(ARGV[6])
  local lapse = now + tonumber(ARGV[8])
  local rows = {}
  local k = most
  for i = 1, n do
    local at = 8 + (i - 1) * 7
    local key, holds = KEYS[2 * i - 1], KEYS[2 * i]
    local spent_c, spent_t, held_c, held_t = load(key, holds, tonumber(ARGV[at + 1]),
                                                  tonumber(ARGV[at + 2]))
    local limit_c, limit_t = tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
    keep(key, holds, ARGV[at + 7])
    rows[i] = {spent_c, held_c, limit_c, spent_t, held_t, limit_t}
    if limit_c >= 0 and ARGV[at + 5] == '1' and unit_c > 0 then
      k = math.min(k, math.floor((limit_c - spent_c - held_c - base_c) / unit_c))
    end
    if limit_t >= 0 and ARGV[at + 6] == '1' and unit_t > 0 then
      k = math.min(k, math.floor((limit_t - spent_t - held_t - base_t) / unit_t))
    end
  end
  if most > 0 then k = math.max(k, 1) else k = 0 end
  local need_c, need_t = base_c + k * unit_c, base_t + k * unit_t
  for i = 1, n do
    local r = rows[i]
    if r[3] >= 0 and r[1] + r[2] + need_c > r[3] then
      return {0, i, 1, r[1], r[2]}
    end
    if r[6] >= 0 and r[4] + r[5] + need_t > r[6] then
      return {0, i, 2, r[4], r[5]}
    end
  end
  local m = member(ARGV[7], need_c, need_t)
  for i = 1, n do
    if redis.call('ZADD', KEYS[2 * i], lapse, m) == 1 then
      redis.call('HINCRBY', KEYS[2 * i - 1], 'held_c', need_c)
      redis.call('HINCRBY', KEYS[2 * i - 1], 'held_t', need_t)
    end
  end
  return {1, k}
end

if op == 'resize' then
  local was_c, was_t = tonumber(ARGV[2]), tonumber(ARGV[3])
  local now_c, now_t = tonumber(ARGV[4]), tonumber(ARGV[5])
  local lapse = now + tonumber(ARGV[7])
  for i = 1, n do
    if redis.call('ZREM', KEYS[2 * i], member(ARGV[6], was_c, was_t)) == 1 then
      redis.call('ZADD', KEYS[2 * i], lapse, member(ARGV[6], now_c, now_t))
      redis.call('HINCRBY', KEYS[2 * i - 1], 'held_c', now_c - was_c)
      redis.call('HINCRBY', KEYS[2 * i - 1], 'held_t', now_t - was_t)
    end
  end
  return 1
end

if op == 'settle' then
  local need_c, need_t = tonumber(ARGV[2]), tonumber(ARGV[3])
  local actual_c, actual_t = tonumber(ARGV[4]), tonumber(ARGV[5])
  local m = ARGV[6] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3]
  for i = 1, n do
    local at = 6 + (i - 1) * 5
    local key, holds = KEYS[2 * i - 1], KEYS[2 * i]
    load(key, holds, tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]))
    if ARGV[at + 3] == '1' and redis.call('ZREM', holds, m) == 1 then
      redis.call('HINCRBY', key, 'held_c', 0 - need_c)
      redis.call('HINCRBY', key, 'held_t', 0 - need_t)
    end
    if ARGV[at + 4] == '1' then
      redis.call('HINCRBY', key, 'spent_c', actual_c)
      redis.call('HINCRBY', key, 'spent_t', actual_t)
    end
    keep(key, holds, ARGV[at + 5])
  end
  return 1
end

-- renew
local lapse, at, renewed = now + tonumber(ARGV[2]), 3, 0
for i = 1, n do
  local count = tonumber(ARGV[at])
  for j = 1, count do
    renewed = renewed + redis.call('ZADD', KEYS[2 * i], 'XX', 'CH', lapse, ARGV[at + j])
  end
  at = at + count + 1
end
return renewed
