"""The gateway's side of the ``agentclaims`` object: what a completion's body may carry
(``Extension``) and who answers (``Instance``: in every answer's object and headers)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentclaims.errors import UsageError
from agentclaims.gateway.limits import SEQ_LIMIT
from agentclaims.protocol import EXTENSION_KEY, INSTANCE_HEADER, INSTANCE_URL_HEADER

__all__ = ["Extension", "Instance", "event_cursor"]


@dataclass(frozen=True, slots=True)
class Instance:
    """Who this gateway is in a fleet (docs/fleet.md)."""

    instance_id: str = "gateway"
    advertise_url: str | None = None
    behind_router: bool = False

    @property
    def fields(self) -> dict[str, str]:
        """The same, in a completion's ``agentclaims`` object and a refusal's error body:
        routers pass bodies through but not every header."""
        out = {"instance": self.instance_id}
        if self.advertise_url:
            out["instance_url"] = self.advertise_url
        return out

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """``headers`` as a response's raw headers (ASGI): added to each in one step."""
        return [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]

    @property
    def headers(self) -> dict[str, str]:
        out = {INSTANCE_HEADER: self.instance_id}
        if self.advertise_url:
            out[INSTANCE_URL_HEADER] = self.advertise_url
        return out


_MAX_RELEASES = 64


@dataclass(frozen=True, slots=True)
class Extension:
    """The ``agentclaims`` object of a completion request's body (every field optional)."""

    session_id: str | None = None
    workflow_id: str | None = None
    owner_scope: str | None = None
    node: str | None = None
    step: int | None = None
    admit: bool = True
    request_id: str | None = None
    claims: tuple[Mapping[str, Any], ...] = ()
    release: tuple[str, ...] = ()
    """Claims of this request's owner to let go before it runs: they ride on it."""
    release_done: tuple[str, ...] = ()
    """Of ``release``, those whose prefix nothing is expected to use again: their blocks are
    handed back as the next victims (``done``), not as the freshest."""
    release_when_done: bool = False
    """Where the answer calls no tool (the agent is done: its run ends, or nothing will use
    its prefix again), the claims this call carries are released as it is answered (``done``:
    their blocks the next victims), and the answer's ``released`` says so: no release of their
    own follows the run's last call."""
    events_since: int | None = None
    """The caller's event cursor: the answer then carries the events after it (those of the
    ``session_id``'s claims and requests, as ``GET /v1/events?id_prefix=`` pages them), so a
    session needs no event poll while its calls flow."""

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> Extension:
        raw = body.get(EXTENSION_KEY)
        if raw is None:
            return _NONE  # a plain OpenAI call's (frozen: one serves them all)
        if not isinstance(raw, Mapping):
            raise UsageError(EXTENSION_KEY, f"expected an object, got {raw!r}")
        known = {"session_id", "workflow_id", "owner_scope", "node", "step", "admit"}
        known |= {"request_id", "claims", "release", "release_done", "events_since"}
        known.add("release_when_done")
        extra = set(raw) - known
        if extra:
            raise UsageError(EXTENSION_KEY, f"unknown fields {sorted(extra)}")
        strings = {}
        for name in ("session_id", "workflow_id", "owner_scope", "node", "request_id"):
            value = raw.get(name)
            if value is not None and (not isinstance(value, str) or not value):
                raise UsageError(
                    f"{EXTENSION_KEY}.{name}", f"must be a non-empty string, got {value!r}"
                )
            strings[name] = value
        step = raw.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise UsageError(
                f"{EXTENSION_KEY}.step", f"must be a non-negative integer, got {step!r}"
            )
        admit = raw.get("admit", True)
        when_done = raw.get("release_when_done", False)
        for name, value in (("admit", admit), ("release_when_done", when_done)):
            if not isinstance(value, bool):
                raise UsageError(f"{EXTENSION_KEY}.{name}", f"must be true or false, got {value!r}")
        claims = raw.get("claims")
        claims = [] if claims is None else claims
        if not isinstance(claims, list):
            raise UsageError(f"{EXTENSION_KEY}.claims", f"must be a list, got {claims!r}")
        release = raw.get("release")
        release = [] if release is None else release
        if (
            not isinstance(release, list)
            or len(release) > _MAX_RELEASES
            or not all(isinstance(c, str) and c for c in release)
            or len(set(release)) != len(release)
        ):
            raise UsageError(
                f"{EXTENSION_KEY}.release",
                f"must be a list of at most {_MAX_RELEASES} distinct claim ids, got {release!r}",
            )
        done = raw.get("release_done")
        done = [] if done is None else done
        if not isinstance(done, list) or not all(isinstance(c, str) and c in release for c in done):
            raise UsageError(
                f"{EXTENSION_KEY}.release_done",
                f"must be a list of claim ids named in release, got {done!r}",
            )
        since = event_cursor(raw.get("events_since"), f"{EXTENSION_KEY}.events_since")
        return cls(
            step=step,
            admit=admit,
            claims=tuple(claims),
            release=tuple(release),
            release_done=tuple(done),
            release_when_done=when_done,
            events_since=since,
            **strings,
        )

    @property
    def carries_nothing(self) -> bool:
        """Nothing in it asks the engine's side for work: no claim, no release, admission as
        by default (a plain call's, or the SDK's when its plan declines a claim and nothing
        waits to be let go). Such a call may take the pipeline's lean way; an event cursor it
        names is answered from the events the gateway has heard."""
        return not (self.claims or self.release) and self.admit

    @property
    def default_owner(self) -> str | None:
        return self.owner_scope or self.session_id or self.workflow_id


_NONE = Extension()


def event_cursor(value: Any, field: str) -> int | None:
    """An ``events_since`` cursor as a body carries it (a completion's ``agentclaims`` object,
    a release's body): ``None``, or an event sequence number; else ``UsageError`` naming
    ``field``."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEQ_LIMIT
    ):
        raise UsageError(
            field, f"must be a non-negative integer (an event sequence number), got {value!r}"
        )
    return value
