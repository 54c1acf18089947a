-- Shared per-key token buckets for tokengate replicas (the usage ledger is in SQL).
-- Same arithmetic as app/limits/bucket.py; Redis' own clock (TIME) is the clock, so
-- replicas on different hosts never disagree about refill.
--
-- KEYS = {requests_bucket, tokens_bucket}      (one hash tag: one slot in a Cluster)
-- ARGV = {requests_capacity, tokens_capacity, token_delta, request_delta, cost_1, ..., cost_n}
--   First the settle: token_delta / request_delta are usage minus reservations, summed
--   over the answers this replica settled since its last call for the key (0 0: none;
--   positive debits, negative refunds). Then one reservation of 1 request + cost_i
--   tokens per cost, in order, each decided against what the ones before it left.
--   -> n x {allowed, limit(0 none|1 requests|2 tokens), retry_after_ms,
--           requests_remaining, requests_reset_ms, tokens_remaining, tokens_reset_ms}
--      flattened (empty for n = 0, a settle alone)
-- WINDOW_SEC and BUCKET_TTL_MS come from app/limits/constants.py (via app/state/scripts.py)
-- @constants

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6

local function load(key, capacity)
  local v = redis.call('HMGET', key, 'level', 'stamp', 'capacity')
  local level, stamp, old = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
  if level == nil then
    return capacity
  end
  if old ~= nil and old > 0 and old ~= capacity then
    level = level * capacity / old  -- a limit changed live keeps the fraction used
  end
  if now > stamp then
    level = math.min(capacity, level + (now - stamp) * capacity / WINDOW_SEC)
  end
  return level
end

local function store(key, level, capacity)
  redis.call('HSET', key, 'level', tostring(level), 'stamp', tostring(now), 'capacity', capacity)
  redis.call('PEXPIRE', key, BUCKET_TTL_MS)
end

local function wait_for(level, amount, capacity)
  if amount > capacity then return -1 end
  if level >= amount then return 0 end
  return (amount - level) * WINDOW_SEC / capacity
end

local function until_full(level, capacity)
  return math.max(0, (capacity - level) * WINDOW_SEC / capacity)
end

local rcap, tcap = tonumber(ARGV[1]), tonumber(ARGV[2])
local rlevel, tlevel = load(KEYS[1], rcap), load(KEYS[2], tcap)

local token_delta, request_delta = tonumber(ARGV[3]), tonumber(ARGV[4])
local dirty = token_delta ~= 0 or request_delta ~= 0
if dirty then
  rlevel = math.max(-rcap, math.min(rcap, rlevel - request_delta))
  tlevel = math.max(-tcap, math.min(tcap, tlevel - token_delta))
end

local out = {}
for i = 5, #ARGV do
  local cost = tonumber(ARGV[i])
  local wr, wt = wait_for(rlevel, 1, rcap), wait_for(tlevel, cost, tcap)
  local allowed, limit, retry = 0, 0, 0
  if wr == 0 and wt == 0 then
    allowed = 1
    rlevel = math.max(-rcap, rlevel - 1)
    tlevel = math.max(-tcap, tlevel - cost)
    dirty = true
  elseif wt < 0 then
    limit, retry = 2, -1
  elseif wr >= wt then
    limit, retry = 1, wr
  else
    limit, retry = 2, wt
  end
  local rms = retry
  if retry > 0 then rms = math.ceil(retry * 1000) end
  local n = #out
  out[n + 1], out[n + 2], out[n + 3] = allowed, limit, rms
  out[n + 4] = math.max(0, math.floor(rlevel))
  out[n + 5] = math.ceil(until_full(rlevel, rcap) * 1000)
  out[n + 6] = math.max(0, math.floor(tlevel))
  out[n + 7] = math.ceil(until_full(tlevel, tcap) * 1000)
end

if dirty then
  store(KEYS[1], rlevel, rcap)
  store(KEYS[2], tlevel, tcap)
end
return out
