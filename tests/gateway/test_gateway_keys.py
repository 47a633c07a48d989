"""The API-key file: what parses, and a clear error naming the entry for what does not."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
from servers import gateway_process

from agentclaims.errors import Forbidden, Unauthorized, UsageError
from agentclaims.gateway.tenants import Tenant, TenantKeys

GOOD = """
[[key]]
key = "ak-alpha-0123456789abcdef"
tenant = "alpha"
quota_blocks = 64
max_ttl_s = 30
max_claims = 4

[[key]]
key = "ak-alpha-rotated-0123456789"
tenant = "alpha"
quota_blocks = 64
max_ttl_s = 30
max_claims = 4

[[key]]
key = "ak-ops-0123456789abcdef"
tenant = "ops"
admin = true
"""


def test_a_key_file_maps_keys_to_tenants(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(GOOD)
    keys = TenantKeys.load(path)
    assert set(keys.tenants) == {"alpha", "ops"}
    alpha = keys.authenticate("Bearer ak-alpha-0123456789abcdef")
    assert alpha == Tenant("alpha", quota_blocks=64, max_ttl_s=30.0, max_claims=4)
    assert keys.authenticate("bearer  ak-alpha-rotated-0123456789") == alpha
    assert keys.authenticate("Bearer ak-ops-0123456789abcdef").admin
    with pytest.raises(Unauthorized, match="unknown API key"):
        keys.authenticate("Bearer ak-alpha-0123456789abcdeF")
    with pytest.raises(Unauthorized, match="missing"):
        keys.authenticate(None)
    with pytest.raises(Forbidden, match="operator key"):
        TenantKeys.require_admin(alpha, "GET /metrics")


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("not toml [[", "api_keys", "not valid TOML"),
        ("", "api_keys.key", "expected [[key]] tables"),
        ('[[key]]\nkey = "short"\ntenant = "a"\n', "api_keys.key[0].key", "16 characters"),
        ('[[key]]\nkey = "ak-0123456789abcdef"\n', "api_keys.key[0].tenant", "non-empty"),
        (
            '[[key]]\nkey = "ak-0123456789abcdef"\ntenant = "a"\nquota_blocks = -1\n',
            "api_keys.key[0].quota_blocks",
            "positive",
        ),
        (
            '[[key]]\nkey = "ak-0123456789abcdef"\ntenant = "a"\nmax_claims = 1.5\n',
            "api_keys.key[0].max_claims",
            "integer",
        ),
        (
            '[[key]]\nkey = "ak-0123456789abcdef"\ntenant = "a"\nadmin = "yes"\n',
            "api_keys.key[0].admin",
            "true or false",
        ),
        (
            '[[key]]\nkey = "ak-0123456789abcdef"\ntenant = "a"\ncolour = 1\n',
            "api_keys.key[0]",
            "unknown fields ['colour']",
        ),
        (
            '[[key]]\nkey = "ak-0123456789abcdef"\ntenant = "a"\n'
            '[[key]]\nkey = "ak-0123456789abcdef"\ntenant = "b"\n',
            "api_keys.key[1].key",
            "twice",
        ),
        (
            '[[key]]\nkey = "ak-0123456789abcdef"\ntenant = "a"\nmax_claims = 1\n'
            '[[key]]\nkey = "ak-9876543210abcdef"\ntenant = "a"\nmax_claims = 2\n',
            "api_keys.key[1]",
            "other limits",
        ),
    ],
)
def test_a_bad_key_file_names_what_is_wrong(
    tmp_path: Path, text: str, field: str, message: str
) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=re.escape(message)) as info:
        TenantKeys.load(path)
    assert info.value.field == field


def test_serve_refuses_a_bad_key_file_and_an_open_host_without_keys(tmp_path: Path) -> None:
    bad = tmp_path / "keys.toml"
    bad.write_text('[[key]]\nkey = "short"\ntenant = "a"\n')
    serve = [sys.executable, "-m", "agentclaims.cli.main", "serve", "--port", "0"]
    proc = subprocess.run([*serve, "--api-keys", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "16 characters" in proc.stderr
    proc = subprocess.run([*serve, "--host", "0.0.0.0"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "--api-keys" in proc.stderr
    assert "--allow-unauthenticated" in proc.stderr


def test_clients_without_a_valid_key_get_the_sdks_unauthorized(tmp_path: Path) -> None:
    """Against a gateway with keys, ``openai_client`` and ``chat_model`` on a backend without
    a key raise ``agentclaims.Unauthorized`` saying none came (the client's stand-in key is
    not sent on), and with a wrong key, that it is unknown; outside any session too."""
    import agentclaims
    from agentclaims.backends.http import HTTPBackend

    path = tmp_path / "keys.toml"
    path.write_text(GOOD)

    async def calls(url: str, key: str | None) -> list[str]:
        backend = HTTPBackend(url, api_key=key)
        said = []
        try:
            messages = [{"role": "user", "content": "hello there"}]
            client = agentclaims.openai_client(backend)
            with pytest.raises(Unauthorized) as raised:
                await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
            said.append(str(raised.value))
            with pytest.raises(Unauthorized) as raised:
                await agentclaims.chat_model(backend).ainvoke("hello there")
            said.append(str(raised.value))
        finally:
            await backend.aclose()
        return said

    with gateway_process("--api-keys", str(path)) as url:
        missing = asyncio.run(calls(url, None))
        unknown = asyncio.run(calls(url, "ak-nobody-0123456789abcdef"))
    assert all("missing Authorization" in m for m in missing), missing
    assert all("unknown API key" in m for m in unknown), unknown
