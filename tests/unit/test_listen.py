"""`serve` binds its address itself; a taken one is one clear sentence, before any banner."""

from __future__ import annotations

import pytest

from app.listen import AddressInUse, bind, problem


def test_a_free_port_binds_and_a_taken_one_says_by_whom_to_look() -> None:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.listen()
    try:
        with pytest.raises(AddressInUse) as taken:
            bind("127.0.0.1", port)
        assert f"127.0.0.1:{port} is already in use" in str(taken.value.strerror)
        assert problem("127.0.0.1", port) == taken.value.strerror
    finally:
        sock.close()
    assert problem("127.0.0.1", port) is None  # free again: nothing kept by asking


def test_an_address_the_host_does_not_have_is_named() -> None:
    found = problem("192.0.2.1", 8080)  # TEST-NET-1: never a local address
    assert found is not None and "no such address" in found
