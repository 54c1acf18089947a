-- Per-key concurrency leases shared by tokengate replicas (`max_concurrent`).
-- A key's leases are one sorted set: member = lease id, score = its expiry in Redis'
-- own milliseconds (TIME), so a replica that dies holding leases frees them when they
-- expire, and replicas on different hosts agree on the clock.
--
-- take:    KEYS = {leases}  ARGV = {"take", limit, ttl_ms, lease_id}  -> 1 taken | 0 full
-- renew:   KEYS = {leases}  ARGV = {"renew", ttl_ms, lease_id...}     -> leases renewed
-- release: KEYS = {leases}  ARGV = {"release", lease_id}              -> 1
-- Live caps set through the admin API, one hash for every key:
-- setcap:  KEYS = {caps}    ARGV = {"setcap", key, cap}                -> 1
-- dropcap: KEYS = {caps}    ARGV = {"dropcap", key}                    -> 1 dropped | 0
-- caps:    KEYS = {caps}    ARGV = {"caps"}                            -> {key, cap, ...}
local key, op = KEYS[1], ARGV[1]

if op == 'setcap' then
  redis.call('HSET', key, ARGV[2], ARGV[3])
  return 1
elseif op == 'dropcap' then
  return redis.call('HDEL', key, ARGV[2])
elseif op == 'caps' then
  return redis.call('HGETALL', key)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)

if op == 'take' then
  local limit, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
  if redis.call('ZCARD', key) >= limit then
    return 0
  end
  redis.call('ZADD', key, now + ttl, ARGV[4])
  redis.call('PEXPIRE', key, ttl)
  return 1
elseif op == 'renew' then
  local ttl = tonumber(ARGV[2])
  local renewed = 0
  for i = 3, #ARGV do
    renewed = renewed + redis.call('ZADD', key, 'XX', 'CH', now + ttl, ARGV[i])
  end
  if redis.call('EXISTS', key) == 1 then
    redis.call('PEXPIRE', key, ttl)
  end
  return renewed
elseif op == 'release' then
  redis.call('ZREM', key, ARGV[2])
  return 1
end
return redis.error_reply('unknown op ' .. tostring(op))
