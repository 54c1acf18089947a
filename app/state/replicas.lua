-- Which tokengate processes are alive, and which Redis this is. Called by every process
-- once a second (and once on a clean stop, with op "leave").
--
-- KEYS = {replicas_zset, epoch}                (one hash tag: one slot in a Cluster)
-- ARGV = {op ("beat" | "leave"), replica_id, candidate_epoch}
--   -> {replicas seen in the last REPLICA_WINDOW_MS, epoch}
-- The epoch is set once by whichever process comes first and lives as long as Redis' data:
-- a process that finds another one than it saw before knows Redis lost its state (a
-- restart without persistence), which changes what it charges for an outage.
-- REPLICA_WINDOW_MS comes from app/state/redis_engine.py (app/state/scripts.py writes it here)
-- @constants

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if ARGV[1] == 'leave' then
  redis.call('ZREM', KEYS[1], ARGV[2])
  return {redis.call('ZCARD', KEYS[1]), redis.call('GET', KEYS[2]) or ''}
end
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - REPLICA_WINDOW_MS)
redis.call('PEXPIRE', KEYS[1], 2 * REPLICA_WINDOW_MS)
redis.call('SET', KEYS[2], ARGV[3], 'NX')
return {redis.call('ZCARD', KEYS[1]), redis.call('GET', KEYS[2])}
