"""Shared state: the one Redis connection and what runs over it.

    link.py           the one door to redis-py: a client for the configured shape, pipelines
    scripts.py        Lua scripts declared by their clients, constants written in
    redis_engine.py   group commit, outage and fail mode, the replica heartbeat

The limit store (`app/limits/shared_store.py`), the pacer (`shared_pace.py`), leases
(`concurrency.py`) and budget spend (`app/billing/shared_spend.py`) are its clients.
"""
