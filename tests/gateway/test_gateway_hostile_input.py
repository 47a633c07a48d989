"""Hostile input: malformed or oversized requests over every endpoint are each a 4xx naming
what is wrong, change nothing, and leave the gateway answering (the in-process gateway, and
one real `agentclaims serve` process for the bytes a socket carries)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx2
import pytest
from servers import gateway_process

from agentclaims.backends import EmbeddedBackend
from agentclaims.protocol import collect_events

DEEP = "[" * 5_000 + "]" * 5_000
DEEP_OBJ = '{"a":' * 3_000 + "1" + "}" * 3_000
IDENT = {
    "cache_key_domain": "d",
    "model_id": "m",
    "tokenizer_id": "t",
    "salt_namespace": "s",
    "block_size": 16,
}


def claim(**fields: Any) -> dict[str, Any]:
    """A well-formed claim object, with ``fields`` changed."""
    base = {"claim_id": "c", "owner_scope": "o", "object_id": "p", "cache_identity": IDENT}
    return {**base, "footprint_blocks": 1, "protection_mode": "hard_protected", **fields}


# (method, path, raw body or JSON, expected status, what the error names)
CASES: list[tuple[str, str, Any, int, str]] = [
    ("POST", "/v1/chat/completions", DEEP, 400, "body.depth"),
    ("POST", "/v1/chat/completions", '{"messages": ' + DEEP + "}", 400, "body.depth"),
    ("POST", "/v1/completions", DEEP_OBJ, 400, "body.depth"),
    ("POST", "/v1/claims", DEEP_OBJ, 400, "body.depth"),
    ("POST", "/v1/claims/c/renew", DEEP, 400, "body.depth"),
    ("POST", "/v1/active", DEEP, 400, "body.depth"),
    ("POST", "/v1/residency", DEEP, 400, "body.depth"),
    ("POST", "/v1/instance", DEEP, 400, "body.depth"),
    ("POST", "/v1/chat/completions", "x" * (9 * 1024 * 1024), 413, "body"),
    ("POST", "/v1/chat/completions", "{not json", 400, "body"),
    ("POST", "/v1/chat/completions", "[1, 2]", 400, "body"),
    ("POST", "/v1/chat/completions", b"\xff\xfe", 400, "body"),
    ("POST", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}] * 3000},
        400,
        "messages",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "w" * 1_000_001}]},
        400,
        "body.messages[0].content",
    ),
    ("POST", "/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("POST", "/v1/chat/completions", {"messages": [7]}, 400, "messages[0]"),
    ("POST", "/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "messages[0].role"),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 5}]},
        400,
        "messages[1].content",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "wizard", "content": "x"}]},
        400,
        "messages[0].role",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        400,
        "messages[0].content[0]",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
        400,
        "temperature",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
        400,
        "max_tokens",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "n": 2},
        400,
        "n",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "stop": [1]},
        400,
        "stop",
    ),
    (  # each string within its limit, the prompt over the token limit
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "w " * 200_000}] * 2},
        400,
        "messages",
    ),
    ("POST", "/v1/completions", {"prompt": "w " * 300_000}, 400, "prompt"),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "tools": "t"},
        400,
        "tools",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "agentclaims": []},
        400,
        "agentclaims",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "agentclaims": {"step": -1}},
        400,
        "agentclaims.step",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "agentclaims": {"claims": [1]}},
        400,
        "agentclaims.claims[0]",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "stream": 1},
        400,
        "stream",
    ),
    ("POST", "/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("POST", "/v1/completions", {"prompt": [-1, 2]}, 400, "prompt"),
    ("POST", "/v1/completions", {"prompt": list(range(200_001))}, 400, "body.prompt"),
    ("POST", "/v1/completions", {"prompt": [True]}, 400, "prompt"),
    ("POST", "/v1/claims", {"claim": 5}, 400, "claim"),
    ("POST", "/v1/claims", {"claim": {"claim_id": "c"}}, 400, "claim.owner_scope"),
    (
        "POST",
        "/v1/claims",
        {"claim": claim(footprint_blocks=0)},
        400,
        "footprint_blocks",
    ),
    (
        "POST",
        "/v1/claims",
        {"claim": claim(protection_mode="granite")},
        400,
        "claim.protection_mode",
    ),
    (
        "POST",
        "/v1/claims",
        {
            "claim": claim(),
            "block_hashes": [-5],
        },
        400,
        "block_hashes",
    ),
    (
        "POST",
        "/v1/claims",
        {"claim": claim(extra=1)},
        400,
        "claim",
    ),
    ("GET", "/v1/claims/c", None, 400, "owner_scope"),
    ("POST", "/v1/claims/c/renew", {"owner_scope": "o", "ttl_s": "soon"}, 400, "renewal.ttl_s"),
    ("POST", "/v1/claims/c/renew", {"owner_scope": "o", "forever": True}, 400, "renewal"),
    ("POST", "/v1/claims/c/release", {}, 400, "owner_scope"),
    ("GET", "/v1/events?since=-1", None, 400, "since"),
    ("GET", "/v1/events?since=abc", None, 400, "since"),
    ("GET", "/v1/events?limit=0", None, 400, "limit"),
    ("POST", "/v1/residency", {"prefix_ids": "p"}, 400, "prefix_ids"),
    ("POST", "/v1/residency", {"block_hashes": [1.5]}, 400, "block_hashes"),
    ("POST", "/v1/active", {"segments": [[1]]}, 400, "request.request_id"),
    ("POST", "/v1/active", {"request_id": "r", "segments": "x"}, 400, "request.segments"),
    ("POST", "/v1/instance", {"usable_blocks": 0, "owner_scope": "o"}, 400, "usable_blocks"),
    ("POST", "/v1/instance/step", {"n": 0}, 400, "n"),
]


def _content(body: Any) -> bytes | None:
    if body is None:
        return None
    if isinstance(body, bytes):
        return body
    return (body if isinstance(body, str) else json.dumps(body)).encode()


async def _state(backend: EmbeddedBackend) -> tuple[int, int, int]:
    engine = backend.engine
    return engine.last_seq, engine.free_blocks, len(await collect_events(backend))


@pytest.mark.parametrize(("method", "path", "body", "status", "field"), CASES)
async def test_bad_input_is_a_4xx_naming_it_and_changes_nothing(
    method: str, path: str, body: Any, status: int, field: str
) -> None:
    """Each malformed or oversized request: its 4xx names the field, no state changed, and
    the gateway still answers."""
    backend = EmbeddedBackend(64, 16)
    http = backend.http_client()
    before = await _state(backend)
    response = await http.request(
        method, path, content=_content(body), headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert error["field"] == field, error
    assert await _state(backend) == before
    assert (await http.get("/health")).json()["status"] == "ok"
    await backend.aclose()


KEY = "ak-hostile-0123456789abcdef"


def _ledger_rows(path: Path) -> list[int]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return [
            db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("events", "claims", "owners")
        ]


def test_a_real_gateway_process_survives_the_table(tmp_path: Path) -> None:
    """Over real HTTP on loopback, with a tenant's key and a ledger file: every case of the
    table is a 4xx, the ledger is unchanged after each, and the gateway still serves."""
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[[key]]\nkey = "{KEY}"\ntenant = "t"\nadmin = true\n')
    ledger = tmp_path / "ledger.sqlite"
    args = ("--blocks", "64", "--api-keys", str(keys), "--ledger", str(ledger))
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    with gateway_process(*args) as url, httpx2.Client(base_url=url, timeout=30) as http:
        before = _ledger_rows(ledger)
        for method, path, body, status, _field in CASES:
            response = http.request(method, path, content=_content(body), headers=headers)
            assert response.status_code == status, (path, response.text[:200])
            assert _ledger_rows(ledger) == before, path
            assert http.get("/health").json()["status"] == "ok"
        ok = http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {KEY}"},
        )
        assert ok.status_code == 200
