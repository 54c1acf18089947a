"""The upstream client (aiohttp) end to end: `tokengate serve` reaching `tokengate sim` only
through an HTTP proxy named by the environment (HTTP_PROXY with credentials), as on a
node whose only way out is a proxy. The proxy (`tests.support.forward_proxy`) runs on a
loopback port in a thread of this process, so the test sees every request it carried.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator

import pytest

from tests.support.forward_proxy import ForwardProxy
from tests.support.procs import Gateway, GatewaySpec, Sim

PING = [{"role": "user", "content": "ping"}]
PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


@pytest.fixture
def proxy() -> Iterator[ForwardProxy]:
    loop = asyncio.new_event_loop()
    fp = ForwardProxy(("gw", "pr0xy-secret"))
    started = threading.Event()

    async def run() -> None:
        async with fp:
            started.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()  # until cancelled

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    assert started.wait(10)
    yield fp
    for task in asyncio.all_tasks(loop):
        loop.call_soon_threadsafe(task.cancel)
    thread.join(10)
    loop.close()


def test_serve_reaches_the_upstream_through_the_environments_proxy(
    make_gateway: Callable[..., Gateway], sim: Sim, proxy: ForwardProxy
) -> None:
    # Nothing inherited may route around (or away from) the proxy: empty means unset.
    env = {name: "" for var in PROXY_VARS for name in (var, var.upper())}
    env["HTTP_PROXY"] = proxy.url("gw:pr0xy-secret")
    gateway = make_gateway(GatewaySpec(env=env), sim.url)
    with gateway.openai() as client:
        answer = client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=4)
        assert answer.choices[0].message.content
        chunks = list(
            client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=4, stream=True)
        )
    assert chunks
    carried = [h.split(b" ")[1] for h in proxy.heads]
    assert f"{sim.url}/v1/chat/completions".encode() in carried
    log = (gateway.workdir / "gateway.log").read_text()
    assert f"via proxy http://127.0.0.1:{proxy.port} (from HTTP_PROXY" in log
    assert "pr0xy-secret" not in log


def test_a_config_naming_the_removed_native_client_still_serves_on_aiohttp(
    make_gateway: Callable[..., Gateway], sim: Sim
) -> None:
    gateway = make_gateway(
        GatewaySpec(env={"TOKENGATE_SERVER__UPSTREAM_CLIENT": "native"}), sim.url
    )
    with gateway.openai() as client:
        answer = client.chat.completions.create(model="gpt-4o", messages=PING, max_tokens=4)
    assert answer.choices[0].message.content
    log = (gateway.workdir / "gateway.log").read_text()
    assert log.count("server.upstream_client = 'native' is deprecated") == 1
