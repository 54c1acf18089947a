"""What `tokengate serve` hands uvicorn: the settings that shape its processes."""

from __future__ import annotations

import uvicorn

from app.commands.serve import _config
from app.config.schema import Settings
from app.runtime import compile_runtime


def _uvicorn(settings: dict[str, object]) -> uvicorn.Config:
    runtime = compile_runtime(
        Settings.model_validate({"health_check": {"enabled": False}, **settings}),
        {"TAOTOKEN_API_KEY": "sk-x"},
        no_auth=True,
    )
    return _config("app.main:factory", runtime, "127.0.0.1", 0, 2)


def test_a_slow_worker_start_is_waited_for_longer_than_uvicorns_5_s() -> None:
    # uvicorn gives a new worker 5 s to serve before a reload gives up on it: on a loaded
    # machine the gateway's start took longer and SIGHUP left the old keys in force.
    assert _uvicorn({}).timeout_worker_healthcheck == 30
    config = _uvicorn({"server": {"worker_start_timeout_sec": 7.5}})
    assert config.timeout_worker_healthcheck == 8
