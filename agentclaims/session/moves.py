"""``SessionMoves``: the session moving to another backend, and the claims it loses doing so.

A reroute (a pool member refused: another member, the session's claims released on the old
one first) and a failover (the instance behind a router, or the pool member, stopped
answering: its claims are lost, never silently: each ends ``instance_lost``, named in one
``reaction_failover`` line).
A move the router made itself is reported the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentclaims.protocol import ActiveOutcome
    from agentclaims.session.state import SessionState

__all__ = ["SessionMoves"]


class SessionMoves:
    """Reroutes and failovers of ``session``, and the claims they end."""

    def __init__(self, session: SessionState) -> None:
        self._s = session

    async def reroute(self, outcome: ActiveOutcome) -> bool:
        """Move to another pool member (``ClaimedSession.reroute``)."""
        s = self._s
        old = s.backend
        new = await s.route.reroute([h.prefix_id for h in s.io.held.values()])
        if new is None:
            return False
        await s.lifecycle.release_all(reason="rerouted")
        s.stats.reroutes += 1
        s.log_reaction(
            "reroute", outcome=outcome.to_dict(), from_backend=old.name, to_backend=new.name
        )
        return True

    async def failover(self, reason: str) -> bool:
        """Go on under a new routing key (``ClaimedSession.failover``)."""
        s = self._s
        moved = await s.route.failover()
        if moved is None:
            return False
        instance, new = moved
        hop = getattr(new, "hop", 0)  # behind a router: give its health check a moment
        if hop:
            await s.sleep(min(2.0, 0.25 * hop))
        self._lose_instance(instance, reason, to_backend=new.name)
        return True

    def _lose_instance(self, instance: str | None, reason: str, **where: Any) -> None:
        """Every claim this session had on ``instance`` (gone) ended ``instance_lost``: those
        it held, and those it let go whose release the instance never confirmed; one
        ``reaction_failover`` line names them."""
        s, io = self._s, self._s.io
        made = (*io.held.values(), *io.releasing, *io.ended)  # a pool member's: made there
        gone = s.route.lost_on(instance) | {h.claim_id for h in made if h.backend == instance}
        lost = [h for h in io.held.values() if h.claim_id in gone]
        for held in lost:
            io.lose(held, "instance_lost")
        waiting = [h for h in io.releasing if h.claim_id in gone]
        io.releasing = [h for h in io.releasing if h.claim_id not in gone]
        for held in waiting:  # let go, but never released there: gone with it
            held.end_reason, held.state = "instance_lost", "unknown"
            io.ended.append(held)
            io.log_end(held, "instance_lost")
        lost += waiting
        unconfirmed = [h for h in io.ended if h.state == "unknown" and h.claim_id in gone]
        for held in unconfirmed:
            held.end_reason = "instance_lost"
        lost += [h for h in unconfirmed if h not in lost]
        io.facts.forget(s.backend.name)  # the next instance's cache identity is its own
        s.stats.reroutes += 1
        s.log_reaction(
            "failover",
            reason=reason,
            from_instance=instance,
            lost_claims=[h.claim_id for h in lost],
            **where,
        )

    def follow_instance(self) -> None:
        """Behind a router: if the router itself moved this session to another instance (it
        ejected a dead worker and kept the key), its claims there are lost: say so."""
        move = self._s.route.take_move()
        if move is not None:
            old, new = move
            self._lose_instance(
                old, "the router moved the session to another instance", to_instance=new
            )
