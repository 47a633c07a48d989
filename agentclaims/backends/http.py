"""``HTTPBackend``: the claims protocol over HTTP, against an agentclaims gateway.

It speaks the whole protocol (claims API, ``ActiveServing``, ``InstanceControl``); what the
gateway's KV side does not offer comes back as ``OperationNotExposed``. The descriptor is read
once and kept.

Transport failures (refused connection, timeouts, a closed backend) become
``BackendUnavailable``; error bodies become the exceptions they stand for (``UsageError``,
``ScopeViolation``, ``UnknownClaim``, ``IllegalTransition``); anything unreadable is a
``BackendError``. Every call is bounded by the client's timeouts: a dead backend never hangs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit

import httpx2

from agentclaims.backends.releases import ReleaseQueue
from agentclaims.contract import (
    BlockHash,
    CacheIdentity,
    ClaimId,
    ClaimSpec,
    OwnerScope,
    PrefixId,
)
from agentclaims.contract.wire import Wire
from agentclaims.errors import AgentClaimsError, BackendError, BackendUnavailable, UsageError
from agentclaims.protocol import (
    RENEW_AS_IS,
    ActiveRequest,
    ClaimDecision,
    ClaimView,
    Descriptor,
    EventPage,
    Renewal,
    ServeResult,
    raise_for_error,
)

__all__ = ["HTTPBackend"]

W = TypeVar("W", bound=Wire)

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
_ROOT_PATHS = ("/health",)
"""Served beside ``/v1``, not under it."""


def _normalize(base_url: str, field: str = "base_url") -> str:
    """``base_url`` with ``/v1`` (added if missing); else ``UsageError`` naming ``field``: not an
    http(s) URL, no host, a port out of range or not a number, whitespace, a query or a
    fragment (nothing a path can be added to)."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise UsageError(field, f"must be an http(s) URL with a host, got {base_url!r}")
    parts = urlsplit(base_url)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # out of 0..65535, or not a number
        port_ok = False
    if not parts.hostname or any(c.isspace() for c in base_url):
        raise UsageError(field, f"must be an http(s) URL with a host, got {base_url!r}")
    if not port_ok:
        raise UsageError(field, f"names no valid port (1..65535), got {base_url!r}")
    if parts.query or parts.fragment or base_url.endswith(("?", "#")):
        raise UsageError(field, f"must carry no query or fragment, got {base_url!r}")
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def check_seconds(field: str, value: object) -> None:
    """A timeout as a backend takes it: a positive, finite number of seconds (not NaN, not
    infinite: every call is bounded; not a bool); else ``UsageError`` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise UsageError(
            field,
            f"must be a positive number of seconds, finite (calls are bounded), got {value!r}",
        )


def check_name(name: object) -> None:
    """A backend's ``name``: a non-empty string."""
    if not isinstance(name, str) or not name:
        raise UsageError("name", f"must be a non-empty string, got {name!r}")


class HTTPBackend:
    """A gateway reached over HTTP. ``base_url`` is the OpenAI-compatible base (``.../v1``; it
    is added if missing). Pass ``client`` to share an ``httpx2.AsyncClient`` (then closing the
    backend leaves it open). ``api_key`` is the tenant's key on a gateway that has keys
    (``Authorization: Bearer``; default ``$AGENTCLAIMS_API_KEY``)."""

    def __init__(
        self,
        base_url: str,
        *,
        name: str | None = None,
        client: httpx2.AsyncClient | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        api_key: str | None = None,
    ) -> None:
        check_seconds("timeout_s", timeout_s)
        check_seconds("connect_timeout_s", connect_timeout_s)
        if name is not None:
            check_name(name)
        if client is not None and not isinstance(client, httpx2.AsyncClient):
            raise UsageError("client", f"expected an httpx2.AsyncClient or None, got {client!r}")
        self.base_url = _normalize(base_url)
        self.root_url = self.base_url.removesuffix("/v1")
        self.share_key: str | None = self.base_url
        """What the sessions of this process share the engine's pool under (``PoolShare``):
        every backend to one URL alike."""
        self.name = name or urlsplit(self.base_url).netloc
        if api_key is None:
            api_key = os.environ.get("AGENTCLAIMS_API_KEY") or None
        if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
            raise UsageError("api_key", f"must be a non-empty string, got {api_key!r}")
        self.api_key = api_key
        self._auth = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self._owns_client = client is None
        self._client = client or httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout_s, connect=connect_timeout_s), headers=self._auth
        )
        self._closed = False
        self.events_seen = 0
        """The highest event sequence number this process's sessions have read from this
        gateway: a session starting now has no event at or before it (its first read starts
        there)."""
        self._descriptor: Descriptor | None = None
        self._releases = ReleaseQueue(self._release_one, self._release_many)
        """Releases asked for while one is out go together (``ReleaseQueue``)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, base_url={self.base_url!r})"

    def http_client(self) -> httpx2.AsyncClient:
        """The client the OpenAI SDK should be given (``AsyncOpenAI(http_client=...)``)."""
        self._check_open()
        return self._client

    def _check_open(self) -> None:
        if self._closed:
            raise BackendUnavailable(f"backend {self.name!r} is closed")

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        self._check_open()
        url = (self.root_url if path in _ROOT_PATHS else self.base_url) + path
        try:
            response = await self._client.request(
                method, url, json=json, params=params, headers=self._auth
            )
        except httpx2.TransportError as exc:
            raise BackendUnavailable(
                f"backend {self.name!r} unreachable ({method} {url}): {self._why(exc)}"
            ) from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code >= 400:
            status = response.status_code
            if status in (502, 504) or (status == 503 and not isinstance(body, dict)):
                raise BackendUnavailable(f"backend {self.name!r} answered HTTP {status}")
            if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
                raise BackendError(  # not an agentclaims gateway's answer (a wrong URL?)
                    f"backend {self.name!r}: {method} {url} answered HTTP {status} without an "
                    "agentclaims error body (is it an agentclaims gateway?)"
                )
            raise_for_error(status, body)
        if not isinstance(body, dict):
            raise BackendError(f"backend {self.name!r}: {method} {path} did not answer an object")
        return body

    def _why(self, exc: httpx2.TransportError) -> str:
        """A transport error as a message: a timeout names the setting that bounded it (the
        client's own, where one was given)."""
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        limits = self._client.timeout
        if isinstance(exc, httpx2.ConnectTimeout):
            return f"{what} (no connection within {limits.connect} s, connect_timeout_s)"
        if isinstance(exc, httpx2.TimeoutException):
            return f"{what} (no answer within {limits.read} s, timeout_s)"
        return what

    @staticmethod
    def _parse(kind: type[W], data: Any) -> W:
        try:
            return kind.from_dict(data)
        except UsageError as exc:
            raise BackendError(f"unreadable {kind.__name__}: {exc}") from exc

    # ------------------------------------------------------------------ claims protocol
    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        body: dict[str, Any] = {"claim": spec.to_dict()}
        if block_hashes is not None:
            body["block_hashes"] = [int(h) for h in block_hashes]
        return self._parse(ClaimDecision, await self._call("POST", "/claims", json=body))

    async def get_claim(self, claim_id: ClaimId, owner_scope: OwnerScope) -> ClaimView:
        data = await self._call("GET", f"/claims/{claim_id}", params={"owner_scope": owner_scope})
        return self._parse(ClaimView, data)

    async def renew_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, renewal: Renewal = RENEW_AS_IS
    ) -> ClaimView:
        body = {"owner_scope": owner_scope, **renewal.to_dict()}
        data = await self._call("POST", f"/claims/{claim_id}/renew", json=body)
        return self._parse(ClaimView, data)

    async def release_claim(
        self, claim_id: ClaimId, owner_scope: OwnerScope, *, done: bool = False
    ) -> ClaimView:
        view, _ = await self.release_claim_with_events(claim_id, owner_scope, done=done)
        return view

    async def release_claim_with_events(
        self,
        claim_id: ClaimId,
        owner_scope: OwnerScope,
        *,
        done: bool = False,
        events_since: int | None = None,
        id_prefix: str | None = None,
    ) -> tuple[ClaimView, dict[str, Any] | None]:
        """Release a claim; with ``events_since``, its answer also carries the events after
        that cursor (``id_prefix``'s only), the release's own included: the page as the
        gateway sent it, or ``None`` (none asked for, or a gateway that carries none)."""
        body: dict[str, Any] = {"owner_scope": owner_scope}
        if done:
            body["done"] = True
        if events_since is not None:
            body["events_since"] = events_since
            if id_prefix is not None:
                body["id_prefix"] = id_prefix
        data = await self._releases.release({"claim_id": claim_id, **body})
        page = data.pop("events", None) if isinstance(data, dict) else None
        return self._parse(ClaimView, data), page if isinstance(page, dict) else None

    async def _release_one(self, item: dict[str, Any]) -> dict[str, Any]:
        body = {k: v for k, v in item.items() if k != "claim_id"}
        return await self._call("POST", f"/claims/{item['claim_id']}/release", json=body)

    async def _release_many(
        self, items: Sequence[dict[str, Any]]
    ) -> list[dict[str, Any] | AgentClaimsError]:
        """Several releases in one ``POST /v1/releases``: per item its data, or its error."""
        data = await self._call("POST", "/releases", json={"releases": list(items)})
        answers = data.get("released")
        if not isinstance(answers, list):
            raise BackendError(f"backend {self.name!r}: POST /releases answered no list")
        out: list[dict[str, Any] | AgentClaimsError] = []
        for answer in answers:
            if not isinstance(answer, dict):
                out.append(BackendError(f"backend {self.name!r}: a release answered {answer!r}"))
            elif "error" in answer:
                try:
                    raise_for_error(int(answer.get("status") or 500), answer)
                except AgentClaimsError as exc:
                    out.append(exc)
            else:
                out.append(answer)
        return out

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        params: dict[str, Any] = {"since": since}
        if id_prefix is not None:
            params["id_prefix"] = id_prefix
        if limit is not None:
            params["limit"] = limit
        return self._parse(EventPage, await self._call("GET", "/events", params=params))

    async def residency(self, prefix_ids: Sequence[PrefixId]) -> dict[PrefixId, int]:
        page = await self._call("POST", "/residency", json={"prefix_ids": list(prefix_ids)})
        return {PrefixId(str(k)): int(v) for k, v in page.get("residency", {}).items()}

    async def descriptor(self) -> Descriptor:
        """The gateway's descriptor, read once per backend and kept (a closed backend
        answers none: ``BackendUnavailable``)."""
        self._check_open()
        if self._descriptor is None:
            self._descriptor = await self._call("GET", "/descriptor")
            # every event up to the gateway's last one now was written before this process
            # asked (a session's claims and calls come after the descriptor is read)
            seq = self._descriptor.get("events_seq")
            if type(seq) is int and seq > self.events_seen:
                self.events_seen = seq
        return self._descriptor

    async def cache_identity(self) -> CacheIdentity:
        """The identity claims on this backend must carry (from the descriptor)."""
        desc = await self.descriptor()
        try:
            return CacheIdentity.from_dict(desc.get("cache_identity"))
        except UsageError as exc:
            raise BackendError(f"backend {self.name!r}: unreadable descriptor: {exc}") from exc

    # ------------------------------------------------------------------ ActiveServing
    async def serve(self, request: ActiveRequest) -> ServeResult:
        return self._parse(ServeResult, await self._call("POST", "/active", json=request.to_dict()))

    async def block_residency(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        body = {"block_hashes": [int(h) for h in block_hashes]}
        resident = (await self._call("POST", "/residency", json=body)).get("resident")
        if not isinstance(resident, list) or len(resident) != len(block_hashes):
            raise BackendError(f"backend {self.name!r}: unreadable block residency")
        return [bool(r) for r in resident]

    # ------------------------------------------------------------------ InstanceControl
    async def fresh_instance(self, usable_blocks: int, owner_scope: OwnerScope) -> CacheIdentity:
        body = {"usable_blocks": usable_blocks, "owner_scope": owner_scope}
        data = await self._call("POST", "/instance", json=body)
        self._descriptor = None  # the instance changed
        return self._parse(CacheIdentity, data.get("cache_identity"))

    async def step(self, n: int = 1) -> None:
        await self._call("POST", "/instance/step", json={"n": n})

    async def metrics(self) -> Mapping[str, Any]:
        """The gateway's counters (engine stats, pool occupancy, requests)."""
        return await self._call("GET", "/stats")

    async def health(self) -> bool:
        """True when the gateway answers ``/health`` that it is ``ok``; False otherwise: it
        cannot be reached, it answers it is not (``503``, ``unavailable`` or ``stopping``),
        or what answers is no gateway. It never raises for an unhealthy backend."""
        try:
            return (await self._call("GET", "/health")).get("status") == "ok"
        except BackendError:  # BackendUnavailable and ServiceUnavailable among them
            return False

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._releases.close(f"backend {self.name!r} is closed")
            if self._owns_client:
                await self._client.aclose()

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
