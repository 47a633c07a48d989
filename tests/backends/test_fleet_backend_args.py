"""``FleetBackend``'s arguments are checked as ``HTTPBackend``'s are: a bad timeout is a
``UsageError`` naming ``timeout_s``, before any client is built."""

from __future__ import annotations

import pytest

from agentclaims.backends.fleet import FleetBackend
from agentclaims.backends.http import HTTPBackend
from agentclaims.errors import UsageError


@pytest.mark.parametrize("timeout_s", [0, -1, "x", float("nan"), True, None])
def test_a_bad_timeout_is_a_usage_error_as_on_http(timeout_s: object) -> None:
    """0 was accepted, 'x' raised httpx2's TypeError; both backends now refuse alike."""
    for backend in (FleetBackend, HTTPBackend):
        with pytest.raises(UsageError) as error:
            backend("http://127.0.0.1:1", timeout_s=timeout_s)  # type: ignore[arg-type]
        assert error.value.field == "timeout_s"
        assert error.value.message.startswith("must be a positive number of seconds")


def test_a_positive_timeout_is_kept() -> None:
    fleet = FleetBackend("http://127.0.0.1:1", timeout_s=2.5)
    assert fleet.timeout.read == 2.5


async def test_each_instances_claims_api_is_asked_within_the_fleets_timeout() -> None:
    """The instances' own backends (their claims API, their events) take the fleet's
    ``timeout_s``, not ``HTTPBackend``'s default."""
    fleet = FleetBackend("http://127.0.0.1:1", timeout_s=2.5)
    member = fleet._member("gpu-a", "http://127.0.0.1:2")
    try:
        assert member._client.timeout.read == 2.5
    finally:
        await member.aclose()
        await fleet.aclose()
