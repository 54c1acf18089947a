-- One domain's pace, shared by every tokengate replica and worker on one upstream key.
-- The arithmetic of app/limits/pacing.py (PaceState), step for step; the same cases drive
-- both (tests/unit/limits/test_pace.py, and tests/e2e/test_pace_parity.py for this one).
-- Redis' TIME is the clock, so replicas on different hosts agree; times in and out are
-- relative.
--
-- KEYS = {pace_hash}
-- ARGV = {op, ceiling_r, ceiling_t, window, now_override, ...}
--   ceiling_*: units/s after headroom, or -1 (none); now_override: "" in production
--   reserve:   ..., requests_1, tokens_1, ..., requests_n, tokens_n
--                                -> {"wait_ms_1,...,wait_ms_n", cool_ms, rate, token_rate, learned}
--   throttled: ..., wait_ms|-1, sent_ago_ms, accepted_rate
--                                              -> {new_episode, cool_ms, rate, token_rate, learned}
--   observe:   ..., limit_r|-1, limit_t|-1, exhausted_ms|-1   (limits per minute)
--                                              -> {0, cool_ms, rate, token_rate, learned}
--   state:     ..., answered                  -> {0, cool_ms, rate, token_rate, learned}
--              (answered: this replica's upstream answers since its last `state` call,
--               reported once a second, so a throttle knows what every replica got)
-- rate / token_rate are strings ("-1": unbounded); the hash expires after a quiet hour.
-- HEADROOM, BETA, ... come from app/limits/constants.py (app/state/scripts.py writes them here)
-- @constants

local op = ARGV[1]
local ceiling_r, ceiling_t, window = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if ceiling_r < 0 then ceiling_r = nil end
if ceiling_t < 0 then ceiling_t = nil end
local now
if ARGV[5] ~= '' then
  now = tonumber(ARGV[5])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1e6
end

local FIELDS = {'tat_r', 'tat_t', 'learned', 'learned_at', 'cool_until', 'backoff',
                'header_r', 'header_t', 'a_sec', 'a_cur', 'a_prev'}
local s = {}
local raw = redis.call('HMGET', KEYS[1], unpack(FIELDS))
for i, name in ipairs(FIELDS) do s[name] = tonumber(raw[i]) end
s.tat_r, s.tat_t = s.tat_r or 0, s.tat_t or 0
s.learned_at, s.cool_until, s.backoff = s.learned_at or 0, s.cool_until or 0, s.backoff or 0

local function lowest(a, b)
  if a == nil then return b end
  if b == nil then return a end
  return math.min(a, b)
end

local function ceiling() return lowest(ceiling_r, s.header_r) end

local function rate()
  local top = ceiling()
  if s.learned == nil then return top end
  local step = math.max(GROWTH * s.learned, MIN_STEP)
  local grown = s.learned + step * math.max(0, now - s.learned_at)
  local limit = top
  if limit == nil then limit = FORGET * s.learned end
  if grown >= limit then
    s.learned = nil
    return top
  end
  return grown
end

local function token_rate()
  local top_t = lowest(ceiling_t, s.header_t)
  if top_t == nil or s.learned == nil then return top_t end
  local r, top = rate(), ceiling()
  if r ~= nil and top ~= nil and top > 0 then return top_t * r / top end
  return top_t
end

local function gcra(tat, at_least, amount, r)
  local quota = r * window
  local burst = math.max(1.0, math.floor(BURST_SHARE * quota))
  local spacing = math.max(r - (burst - 1) / window, r / 2)
  tat = math.max(tat, at_least)
  local tolerance = (burst - math.min(amount, burst)) / spacing
  return math.max(at_least, tat - tolerance), tat + amount / spacing
end

local function cool(untl)
  if untl > s.cool_until then
    s.cool_until = untl
    s.tat_r = math.max(s.tat_r, untl)
    s.tat_t = math.max(s.tat_t, untl)
  end
end

local function save()
  local args = {}
  for _, name in ipairs(FIELDS) do
    if s[name] ~= nil then
      table.insert(args, name)
      table.insert(args, string.format('%.17g', s[name]))  -- tostring keeps 14 digits
    end
  end
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], unpack(args))
  redis.call('PEXPIRE', KEYS[1], PACE_TTL_MS)
end

-- Answers every replica reported, per second (two buckets: the current and the last).
local function count_answers(n)
  local second = math.floor(now)
  if s.a_sec == second then
    s.a_cur = (s.a_cur or 0) + n
  else
    if s.a_sec == second - 1 then s.a_prev = s.a_cur or 0 else s.a_prev = 0 end
    s.a_sec, s.a_cur = second, n
  end
end

local function shared_accepted()
  local second = math.floor(now)
  if s.a_sec == second then return s.a_prev or 0 end
  if s.a_sec == second - 1 then return s.a_cur or 0 end
  return 0
end

local function reply(first)
  local r, t = rate(), token_rate()
  return {first, math.ceil(math.max(0, s.cool_until - now) * 1000),
          tostring(r or -1), tostring(t or -1), s.learned ~= nil and 1 or 0}
end

if op == 'reserve' then
  -- One booking per (requests, tokens) pair, in order: a replica sends the reservations
  -- of one domain that queued up meanwhile together, one round trip for all of them.
  local start = math.max(now, s.cool_until)
  local r, t = rate(), token_rate()
  local waits = {}
  for i = 6, #ARGV, 2 do
    local requests, tokens = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
    local go, at = start, nil
    if requests > 0 and r ~= nil then
      at, s.tat_r = gcra(s.tat_r, start, requests, r)
      go = math.max(go, at)
    end
    if tokens > 0 and t ~= nil then
      at, s.tat_t = gcra(s.tat_t, start, tokens, t)
      go = math.max(go, at)
    end
    waits[#waits + 1] = math.ceil((go - now) * 1000)
  end
  save()
  return reply(table.concat(waits, ','))
elseif op == 'throttled' then
  local wait_ms, sent_ago, accepted = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  local sent_at = now - sent_ago / 1000
  if sent_at < s.cool_until then
    if wait_ms >= 0 then cool(now + math.min(wait_ms / 1000, MAX_COOL_DOWN)) end
    save()
    return reply(0)
  end
  local wait
  if wait_ms >= 0 then
    wait = wait_ms / 1000
  else
    if accepted <= 0 and s.backoff > 0 then
      s.backoff = math.min(MAX_BACKOFF, 2 * s.backoff)
    else
      s.backoff = FIRST_BACKOFF
    end
    wait = s.backoff
  end
  accepted = math.max(accepted, shared_accepted())
  local current = rate()
  if accepted > 0 then
    local target = ACCEPTED_SHARE * accepted
    if current ~= nil then target = math.min(current, target) end
    s.learned = math.max(MIN_RATE, target)
  elseif current ~= nil then
    s.learned = math.max(MIN_RATE, BETA * current)
  else
    s.learned = MIN_RATE * 5
  end
  cool(now + math.min(math.max(wait, 0.05), MAX_COOL_DOWN))
  s.learned_at = s.cool_until
  save()
  return reply(1)
elseif op == 'observe' then
  local limit_r, limit_t, exhausted = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  if limit_r >= 1 then s.header_r = limit_r / 60 * HEADROOM end
  if limit_t >= 1 then s.header_t = limit_t / 60 * HEADROOM end
  if exhausted >= 0 then cool(now + math.min(exhausted / 1000, window)) end
  save()
  return reply(0)
end
-- state
local answered = tonumber(ARGV[6] or '0') or 0
if answered > 0 then
  count_answers(answered)
  save()
end
return reply(0)
