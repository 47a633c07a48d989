"""``FleetBackend``: a fleet of gateways behind an existing router (vllm-router), as one backend.

Claims live per instance, so a session's requests must keep reaching the instance that holds
its claims. The router does that by a routing key: every completion of a session carries
``X-Session-ID`` (and the body's ``user``, which routers read when a header is missing). Each
gateway names itself in every answer (``X-Agentclaims-Instance``, with
``X-Agentclaims-Instance-URL``), so the session learns where each claim lives; the claims API
and the event stream are spoken to that instance directly (vllm-router drops query strings, and
a claim must reach its own instance, not whichever the router picks).

Behind the router no claim outcome may be a status the router retries or counts against a worker
(429, 5xx): the fleet asks every gateway for router-safe outcomes (a deferral is a 409 too).

A refused session is rerouted: its binding at the router is ended (``/finish_session``), the
next request goes under a new routing key, the router picks a worker, the session learns it and
re-plans its claims there. An instance that stops answering is failed over the same way, its
claims first reported lost (``claim_lost`` in the session's log). Hops are bounded by the
router's worker count. docs/fleet.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any, Self
from urllib.parse import urlsplit

import httpx2

from agentclaims.backends.base import Backend
from agentclaims.backends.http import HTTPBackend, _normalize, check_seconds
from agentclaims.backends.pool import BackendPool
from agentclaims.contract import BlockHash, ClaimId, ClaimSpec, PrefixId
from agentclaims.errors import BackendUnavailable, UnknownClaim, UsageError
from agentclaims.protocol import (
    EXTENSION_KEY,
    INSTANCE_HEADER,
    INSTANCE_URL_HEADER,
    ROUTER_SAFE_HEADER,
    ClaimDecision,
    Descriptor,
    EventPage,
    ForwardsClaims,
)

__all__ = ["FleetBackend", "RoutedBackend"]

SESSION_HEADER = "X-Session-ID"
"""The routing key vllm-router reads first."""


class RoutedBackend(ForwardsClaims, HTTPBackend):
    """One session's view of the fleet under one routing key: completions go to the router
    with the key, claims to the instance that answered them."""

    def __init__(self, fleet: FleetBackend, session_id: str, hop: int) -> None:
        self.fleet = fleet
        self.session_id = session_id
        self.hop = hop
        self.key = session_id if hop == 0 else f"{session_id}~{hop}"
        self.instance: str | None = None
        """The instance the router sent this key to (from its last answer)."""
        self._move: tuple[str, str] | None = None
        self.previous_key: str | None = None
        """The key this one replaces: its binding is ended after this key's first answer,
        so the router still counts the old one while it places the new one."""
        headers = {SESSION_HEADER: self.key, ROUTER_SAFE_HEADER: "1"}
        client = httpx2.AsyncClient(
            headers=headers,
            timeout=fleet.timeout,
            event_hooks={"response": [self._learn]},
        )
        super().__init__(
            fleet.router_url, name=f"fleet:{self.key}", client=client, api_key=fleet.api_key
        )
        self._owns_client = True
        # behind a router the sessions' calls spread over instances, each its own pool: no
        # one pool's figures stand for the fleet's (each session plans its holds alone)
        self.share_key = None

    async def _learn(self, response: httpx2.Response) -> None:
        """Which instance answered: its header, else (a router that drops it) the
        ``instance`` its completion or refusal body names."""
        instance = response.headers.get(INSTANCE_HEADER)
        url = response.headers.get(INSTANCE_URL_HEADER)
        if not instance and "json" in response.headers.get("content-type", ""):
            await response.aread()
            instance, url = _instance_in(response.content)
        self._moved_to(instance, url)

    def answered_by(self, extension: Any) -> None:
        """The instance a completion's ``agentclaims`` object names (a streamed answer's
        last chunk, which the response hook cannot read)."""
        if isinstance(extension, dict):
            instance, url = extension.get("instance"), extension.get("instance_url")
            if isinstance(instance, str):
                self._moved_to(instance, url if isinstance(url, str) else None)

    def _moved_to(self, instance: str | None, url: str | None) -> None:
        if not instance:
            return
        if self.instance is not None and instance != self.instance and self._move is None:
            self._move = (self.instance, instance)  # the router moved this key by itself
        self.instance = instance
        self.fleet._member(instance, url)
        self.fleet._lost.discard(instance)
        if self.previous_key is not None:  # the old binding ends once this one is made
            self.fleet._finish_later(self.previous_key)
            self.previous_key = None

    def take_move(self) -> tuple[str, str] | None:
        """(old, new) instance if the router sent this key to another instance since the
        last call (it ejected a dead worker); once."""
        move, self._move = self._move, None
        return move

    def _here(self) -> HTTPBackend:
        if self.instance is None:
            raise UsageError(
                "claim", f"session {self.session_id!r} has not reached an instance yet"
            )
        return self.fleet.get_member(self.instance)

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        member = self._here()
        decision = await member.submit_claim(spec, block_hashes)
        self.fleet._home[spec.claim_id] = member.name
        return decision

    def claimed_with_call(self, claim_id: str) -> None:
        """A claim made with a completion (it rode on the call) lives where the call was
        answered: its claim operations go there, and a failover of that instance ends it."""
        self.fleet._home[ClaimId(claim_id)] = self._here().name

    def claim_target(self, claim_id: ClaimId) -> Backend:
        """The fleet member holding the claim (where the call that made it was answered)."""
        return self.fleet.claim_target(claim_id)

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        return await self.fleet.events(since, id_prefix=id_prefix, limit=limit)

    async def residency(self, prefix_ids: Sequence[PrefixId]) -> dict[PrefixId, int]:
        if self.instance is None:
            return dict.fromkeys(prefix_ids, 0)
        return await self._here().residency(prefix_ids)

    async def descriptor(self) -> Descriptor:
        """The descriptor of the instance this key reaches (its lowering is what a claim
        made here is checked on); before any answer, the first instance's."""
        if self.instance is not None:
            return await self._here().descriptor()
        await self.fleet._ensure()
        members = self.fleet.backends
        if not members:
            raise BackendUnavailable(f"{self.fleet.name}: no gateway behind the router answers")
        return await members[0].descriptor()


class FleetBackend(BackendPool):
    """Gateways behind a router at ``router_url`` (vllm-router's ``--policy
    sticky_least_loaded``), as one backend with session affinity, reroute and failover.

    The gateways' claims APIs must be reachable directly: at the URL each advertises
    (``agentclaims serve --advertise-url``), else the one the router lists for it."""

    def __init__(
        self,
        router_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_hops: int | None = None,
    ) -> None:
        # every argument before any client is built
        self.router_url = _normalize(router_url, "router_url").removesuffix("/v1")
        check_seconds("timeout_s", timeout_s)
        if max_hops is not None and (
            isinstance(max_hops, bool) or not isinstance(max_hops, int) or max_hops < 1
        ):
            raise UsageError("max_hops", f"must be a positive integer, got {max_hops!r}")
        if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
            raise UsageError("api_key", f"must be a non-empty string, got {api_key!r}")
        self.base_url = f"{self.router_url}/v1"
        self.api_key = api_key
        self.timeout = httpx2.Timeout(timeout_s, connect=5.0)
        self.timeout_s = timeout_s
        """Each instance's claims API is asked within it too (``HTTPBackend(timeout_s=)``)."""
        self._max_hops = max_hops
        self._router = httpx2.AsyncClient(timeout=self.timeout)
        self._members: dict[str, HTTPBackend] = {}
        self._sessions: dict[str, RoutedBackend] = {}
        self._retired: list[RoutedBackend] = []
        self._pending: set[asyncio.Task[None]] = set()
        self._lost: set[str] = set()
        # the pool's own books: claim homes and the merged event stream
        self._home: dict[str, str] = {}
        self._log: list[tuple[str, Any]] = []
        self._cursors: dict[str, int] = {}
        self._workers: int | None = None
        """How many workers the router lists (after ``discover``)."""
        self._closed = False

    def _check_open(self) -> None:
        """A closed fleet answers nothing and makes no new client (``BackendUnavailable``)."""
        if self._closed:
            raise BackendUnavailable(f"{self.name} is closed")

    # ------------------------------------------------------------------ members
    @property
    def name(self) -> str:
        return f"fleet({urlsplit(self.router_url).netloc})"

    @property
    def backends(self) -> list[Backend]:
        """The instances known so far (from the router's worker list and from answers), but
        those lost until they answer again."""
        return [m for name, m in self._members.items() if name not in self._lost]

    def _member(self, instance: str, url: str | None) -> HTTPBackend:
        member = self._members.get(instance)
        if member is None and url:
            member = HTTPBackend(url, name=instance, api_key=self.api_key, timeout_s=self.timeout_s)
            self._members[instance] = member
            self._cursors.setdefault(instance, 0)
        if member is None:
            raise BackendUnavailable(
                f"instance {instance!r} did not say where its claims API is "
                "(start it with --advertise-url)"
            )
        return member

    def get_member(self, instance: str) -> HTTPBackend:
        member = self._members.get(instance)
        if member is None:
            raise UsageError("instance", f"no instance {instance!r} in {self.name}")
        return member

    def get(self, name: str) -> Any:
        """A member by instance id, or a session's routed backend by its name."""
        for routed in [*self._sessions.values(), *self._retired]:
            if routed.name == name:
                return routed
        return self.get_member(name)

    async def discover(self) -> list[str]:
        """The router's workers (``/list_workers``), each asked who it is; their ids."""
        self._check_open()
        try:
            response = await self._router.get(f"{self.router_url}/list_workers")
            urls = response.json().get("urls", [])
        except (httpx2.TransportError, ValueError, AttributeError) as exc:
            raise BackendUnavailable(f"router at {self.router_url}: {exc!r}") from exc
        for url in urls:
            try:
                answer = await self._router.get(f"{url.rstrip('/')}/health")
            except httpx2.TransportError:
                continue  # down now; learned from an answer if it comes back
            instance = answer.headers.get(INSTANCE_HEADER)
            if instance:
                self._member(instance, answer.headers.get(INSTANCE_URL_HEADER) or url)
        self._workers = max(1, len(urls))
        return list(self._members)

    async def _ensure(self) -> None:
        self._check_open()
        if self._workers is None:
            await self.discover()

    def max_hops(self) -> int:
        """Reroutes a session may make: one per other worker (``max_hops`` if given)."""
        if self._max_hops is not None:
            return self._max_hops
        workers = self._workers if self._workers is not None else len(self._members) or 2
        return max(1, workers - 1)

    # ------------------------------------------------------------------ sessions
    def assign(self, session_id: str) -> RoutedBackend:
        self._check_open()
        routed = self._sessions.get(session_id)
        if routed is None:
            routed = self._sessions[session_id] = RoutedBackend(self, session_id, 0)
        return routed

    async def reroute(
        self, session_id: str, prefix_ids: Sequence[PrefixId] = (), *, failover: bool = False
    ) -> RoutedBackend | None:
        """A new routing key for the session (its old binding ended at the router); ``None``
        once it has made ``max_hops`` hops (twice that many and one more when failing over:
        until the router's health check ejects a dead worker it may pick it again). The router
        picks the worker: it may be the same one, and the session then learns so."""
        await self._ensure()
        old = self.assign(session_id)
        if old.hop >= (2 * self.max_hops() + 1 if failover else self.max_hops()):
            return None
        new = RoutedBackend(self, session_id, old.hop + 1)
        new.previous_key = old.key
        self._retired.append(old)
        self._sessions[session_id] = new
        return new

    async def _finish(self, key: str) -> None:
        with contextlib.suppress(httpx2.TransportError):  # else it expires at the router
            await self._router.post(f"{self.router_url}/finish_session", params={"session_id": key})

    async def candidates(
        self, session_id: str, prefix_ids: Sequence[PrefixId] = ()
    ) -> list[Backend]:
        """None: behind a router a session cannot be sent to an instance of its choosing (a
        tool call's claim that is refused then waits, as ``defer``; a refused request is
        rerouted under a new routing key, ``reroute``)."""
        return []

    def release(self, session_id: str) -> None:
        """The session ended: end its binding at the router (in the background)."""
        routed = self._sessions.pop(session_id, None)
        if routed is None:
            return
        self._retired.append(routed)
        self._finish_later(routed.key)
        if routed.previous_key is not None:
            self._finish_later(routed.previous_key)

    def _finish_later(self, key: str) -> None:
        """End ``key``'s binding at the router in the background (``aclose`` awaits it)."""
        if self._closed:
            return  # the router's client is gone: the binding expires at the router
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self._finish(key))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def instance_of(self, session_id: str) -> str | None:
        routed = self._sessions.get(session_id)
        return None if routed is None else routed.instance

    def lose_instance(self, instance: str) -> list[str]:
        """The ids of every claim that lived on ``instance`` (it stopped answering), whichever
        session made it. Each session sharing this fleet asks in its own failover and ends its
        own: nothing is forgotten here, so the first session's failover cannot hide the
        others' claims from them."""
        self._lost.add(instance)
        return [cid for cid, home in self._home.items() if home == instance]

    async def aclose(self) -> None:
        """Close every client (the router's, the sessions', the instances'); again: nothing."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        for routed in [*self._sessions.values(), *self._retired]:
            await routed.aclose()
        for member in self._members.values():
            await member.aclose()
        await self._router.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ claims protocol
    def claim_target(self, claim_id: ClaimId) -> HTTPBackend:
        """The instance holding claim ``claim_id`` (where the call that made it went)."""
        name = self._home.get(claim_id)
        if name is None:
            raise UnknownClaim(claim_id)
        return self.get_member(name)

    async def submit_claim(
        self, spec: ClaimSpec, block_hashes: Sequence[BlockHash] | None = None
    ) -> ClaimDecision:
        return await self.assign(spec.owner_scope).submit_claim(spec, block_hashes)

    async def events(
        self, since: int = 0, *, id_prefix: str | None = None, limit: int | None = None
    ) -> EventPage:
        """Every known instance's new events in one stream (the pool's own cursor); an
        instance that does not answer is skipped for now."""
        await self._ensure()
        return await self._merged(since, id_prefix=id_prefix, limit=limit)

    async def _merged(self, since: int, *, id_prefix: str | None, limit: int | None) -> EventPage:
        for member in self.backends:
            try:
                page = await member.events(self._cursors[member.name])
            except BackendUnavailable:
                continue
            self._cursors[member.name] = page.next_since
            self._log.extend((member.name, e) for e in page.events)
        return self._page(since, id_prefix=id_prefix, limit=limit)

    async def residency(self, prefix_ids: Sequence[PrefixId]) -> dict[PrefixId, int]:
        await self._ensure()
        out = dict.fromkeys(prefix_ids, 0)
        for member in self.backends:
            try:
                resident = await member.residency(prefix_ids)
            except BackendUnavailable:
                continue
            for pid, n in resident.items():
                out[pid] = max(out.get(pid, 0), n)
        return out

    async def descriptor(self) -> Descriptor:
        """The instances' descriptors; per mode the weakest class among them (fail closed)."""
        await self._ensure()
        members: dict[str, Descriptor] = {}
        for member in self.backends:
            try:
                members[member.name] = await member.descriptor()
            except BackendUnavailable:
                continue
        if not members:
            raise BackendUnavailable(f"{self.name}: no gateway behind the router answers")
        return self._combine(members)

    async def health(self) -> bool:
        if self._closed:
            return False
        try:
            response = await self._router.get(f"{self.router_url}/health")
        except httpx2.TransportError:
            return False
        return response.status_code == 200

    def http_client(self) -> httpx2.AsyncClient:
        """Outside a session: the router, without a routing key."""
        self._check_open()
        return self._router


def _instance_in(content: bytes) -> tuple[str | None, str | None]:
    """The instance (and its URL) a gateway's answer names in its body."""
    try:
        data = json.loads(content)
    except ValueError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    where = data.get(EXTENSION_KEY) or data.get("error")
    if not isinstance(where, dict):
        return None, None
    instance, url = where.get("instance"), where.get("instance_url")
    return (
        instance if isinstance(instance, str) else None,
        url if isinstance(url, str) else None,
    )
