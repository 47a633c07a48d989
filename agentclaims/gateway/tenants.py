"""Tenants and their API keys (``agentclaims serve --api-keys FILE``).

The file is TOML, one ``[[key]]`` table per key (docs/operations.md)::

    [[key]]
    key = "ak-alpha-0123456789abcdef"   # the bearer token the client sends
    tenant = "alpha"
    quota_blocks = 512   # blocks the tenant's live protected claims may cover together
    max_ttl_s = 600      # the longest ttl_s a claim may ask; a claim without one gets it
    max_claims = 64      # live claims at once

    [[key]]
    key = "ak-ops-0123456789abcdef"
    tenant = "ops"
    admin = true         # may read /metrics and /v1/stats and use /v1/instance

Several keys may name one tenant (key rotation); they must then give the same limits. A limit
left out is no limit.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentclaims.errors import Forbidden, Unauthorized, UsageError

__all__ = ["Tenant", "TenantKeys"]

_MIN_KEY_CHARS = 16
_FIELDS = {"key", "tenant", "quota_blocks", "max_ttl_s", "max_claims", "admin"}


@dataclass(frozen=True, slots=True)
class Tenant:
    """Whom a key speaks for, and what it may hold."""

    name: str
    quota_blocks: int | None = None
    max_ttl_s: float | None = None
    max_claims: int | None = None
    admin: bool = False


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class TenantKeys:
    """Keys to tenants. Looked up by the key's SHA-256, so a key is never compared in plain."""

    def __init__(self, entries: Sequence[tuple[str, Tenant]]) -> None:
        if not entries:
            raise UsageError("api_keys", "the key file names no key")
        self._by_digest: dict[bytes, Tenant] = {}
        tenants: dict[str, Tenant] = {}
        for i, (key, tenant) in enumerate(entries):
            where = f"key[{i}]"
            if len(key) < _MIN_KEY_CHARS:
                raise UsageError(f"{where}.key", f"must have at least {_MIN_KEY_CHARS} characters")
            digest = _digest(key)
            if digest in self._by_digest:
                raise UsageError(f"{where}.key", "is given twice")
            known = tenants.setdefault(tenant.name, tenant)
            if known != tenant:
                raise UsageError(
                    f"{where}", f"tenant {tenant.name!r} has other limits on another key"
                )
            self._by_digest[digest] = tenant
        self.tenants: Mapping[str, Tenant] = tenants

    @classmethod
    def load(cls, path: str | Path) -> TenantKeys:
        """Read a key file; a ``UsageError`` names the file and the entry that is wrong."""
        try:
            doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError("api_keys", f"cannot read {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UsageError("api_keys", f"{path} is not valid TOML: {exc}") from None
        try:
            return cls.parse(doc)
        except UsageError as exc:
            raise UsageError(f"api_keys.{exc.field}", f"{exc.message} (in {path})") from None

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> TenantKeys:
        rows = doc.get("key")
        if set(doc) - {"key"}:
            raise UsageError("api_keys", f"unknown tables {sorted(set(doc) - {'key'})}")
        if not isinstance(rows, list):
            raise UsageError("key", "expected [[key]] tables")
        entries = []
        for i, row in enumerate(rows):
            where = f"key[{i}]"
            extra = set(row) - _FIELDS
            if extra:
                raise UsageError(where, f"unknown fields {sorted(extra)}")
            key, name = row.get("key"), row.get("tenant")
            if not isinstance(key, str):
                raise UsageError(f"{where}.key", "must be a string")
            if not isinstance(name, str) or not name or not name.isprintable():
                raise UsageError(f"{where}.tenant", "must be a non-empty printable string")
            tenant = Tenant(
                name,
                quota_blocks=_limit(row, "quota_blocks", where, int),
                max_ttl_s=_limit(row, "max_ttl_s", where, float),
                max_claims=_limit(row, "max_claims", where, int),
                admin=_flag(row, "admin", where),
            )
            entries.append((key, tenant))
        return cls(entries)

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant of an ``Authorization: Bearer KEY`` header (``Unauthorized`` if none)."""
        if not authorization:
            raise Unauthorized("missing Authorization: Bearer <key>")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized("the Authorization header must be 'Bearer <key>'")
        tenant = self._by_digest.get(_digest(key.strip()))
        if tenant is None:
            raise Unauthorized("unknown API key")
        return tenant

    @staticmethod
    def require_admin(tenant: Tenant | None, what: str) -> None:
        if tenant is not None and not tenant.admin:
            raise Forbidden(f"{what} needs an operator key (admin = true)")


def _limit(row: Mapping[str, Any], name: str, where: str, kind: type) -> Any:
    value = row.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise UsageError(f"{where}.{name}", f"must be a positive number, got {value!r}")
    if kind is int and not isinstance(value, int):
        raise UsageError(f"{where}.{name}", f"must be an integer, got {value!r}")
    return kind(value)


def _flag(row: Mapping[str, Any], name: str, where: str) -> bool:
    value = row.get(name, False)
    if not isinstance(value, bool):
        raise UsageError(f"{where}.{name}", f"must be true or false, got {value!r}")
    return value
