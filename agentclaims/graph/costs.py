"""What a call costs on the engine it runs on, learned from the engine's own answers.

Each answered call says how long it took (less any time the engine held it back), how many
full prompt blocks the engine had to compute (``outcome.computed_blocks``: the rest were
cache hits) and how many tokens it generated (``usage.completion_tokens``). Over the last
``window`` calls, :class:`EngineCosts` fits, by least squares::

    seconds = overhead + reload_s_per_block * computed_blocks + decode_s_per_token * tokens

``reload_s_per_block`` is what recomputing one evicted block costs the next call: Continuum's
reload time per block, the ``B`` of the cost-benefit TTL (``ToolTimeModel.ttl``). On a model
whose prefill is cheap it comes out small, and pinning a prefix across a wait is rarely worth
its memory; on one whose prefill is costly it grows, and holding pays. Until the calls seen
determine it (``min_calls``, and computed blocks that vary), the prior stands. The fit leans
toward the prior by ``prior_weight`` calls' worth, so a few noisy calls cannot swing it, and
no coefficient goes below 0.
"""

from __future__ import annotations

import math
from collections import deque

from agentclaims.errors import UsageError

__all__ = ["EngineCosts"]


class EngineCosts:
    """Per-block recompute and per-token decode seconds, fitted from answered calls."""

    __slots__ = ("_calls", "_fit", "_min_calls", "_prior", "_prior_weight", "_sums", "_turns")

    def __init__(
        self,
        prior_reload_s_per_block: float,
        *,
        window: int = 64,
        min_calls: int = 8,
        prior_weight: float = 2.0,
    ) -> None:
        _check_number("prior_reload_s_per_block", prior_reload_s_per_block)
        for name, value, least in (("window", window, 2), ("min_calls", min_calls, 2)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise UsageError(name, f"must be an integer >= {least}, got {value!r}")
        _check_number("prior_weight", prior_weight)
        self._prior = float(prior_reload_s_per_block)
        self._min_calls = min_calls
        self._prior_weight = float(prior_weight)
        self._calls: deque[tuple[float, float, float]] = deque(maxlen=window)
        self._fit: tuple[float, float] | None = None
        self._sums = _Sums()
        """The window's sums, kept as calls come and go: a fit costs the same however long
        the window (re-added from the calls once per window, so rounding cannot pile up)."""
        self._turns = 0

    @property
    def calls(self) -> int:
        """How many calls the fit reads (the last ``window``)."""
        return len(self._calls)

    @property
    def learned(self) -> bool:
        """The calls seen determine the fit (else the prior stands)."""
        return self._fitted() is not None

    @property
    def reload_s_per_block(self) -> float:
        """Seconds to recompute one prompt block (the prior until learned)."""
        fit = self._fitted()
        return self._prior if fit is None else fit[0]

    @property
    def decode_s_per_token(self) -> float | None:
        """Seconds per generated token, once learned."""
        fit = self._fitted()
        return None if fit is None else fit[1]

    def observe(self, seconds: float, computed_blocks: int, completion_tokens: int) -> None:
        """One answered call: its time on the engine (not counting time it was held back),
        the prompt blocks computed for it, the tokens it generated."""
        _check_number("seconds", seconds)
        for name, value in (
            ("computed_blocks", computed_blocks),
            ("completion_tokens", completion_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UsageError(name, f"must be an integer >= 0, got {value!r}")
        call = (float(seconds), float(computed_blocks), float(completion_tokens))
        calls, sums = self._calls, self._sums
        if len(calls) == calls.maxlen:
            sums.add(calls[0], -1.0)
        calls.append(call)
        self._turns += 1
        if self._turns >= len(calls):  # once per window: the sums anew, exactly
            self._turns = 0
            self._sums = sums = _Sums()
            for c in calls:
                sums.add(c, 1.0)
        else:
            sums.add(call, 1.0)
        self._fit = None

    def _fitted(self) -> tuple[float, float] | None:
        if self._fit is None and len(self._calls) >= self._min_calls:
            self._fit = _least_squares(self._sums, self._prior, self._prior_weight)
        return self._fit

    def __repr__(self) -> str:
        return (
            f"EngineCosts(reload_s_per_block={self.reload_s_per_block:.6g}, "
            f"calls={self.calls}, learned={self.learned})"
        )


class _Sums:
    """Sums over a window of calls ``(seconds, blocks, tokens)``: of each, and of the
    products the least-squares fit reads."""

    __slots__ = ("b", "bb", "bd", "bt", "d", "dd", "dt", "n", "t")

    def __init__(self) -> None:
        self.n = self.t = self.b = self.d = 0.0
        self.bb = self.dd = self.bd = self.bt = self.dt = 0.0

    def add(self, call: tuple[float, float, float], sign: float) -> None:
        """``call`` into the sums (``sign`` 1.0), or out of them (-1.0)."""
        t, b, d = call
        self.n += sign
        self.t += sign * t
        self.b += sign * b
        self.d += sign * d
        self.bb += sign * b * b
        self.dd += sign * d * d
        self.bd += sign * b * d
        self.bt += sign * b * t
        self.dt += sign * d * t


def _least_squares(sums: _Sums, prior: float, weight: float) -> tuple[float, float] | None:
    """``(reload_s_per_block, decode_s_per_token)`` fitted with an intercept (the call's fixed
    overhead), centred, with ``weight`` pseudo-calls pulling the block cost toward ``prior``;
    ``None`` when the computed blocks did not vary (nothing to fit them from)."""
    n = sums.n
    mean_b, mean_d = sums.b / n, sums.d / n
    sbb = sums.bb - mean_b * sums.b
    if sbb <= _FLAT * sums.bb:  # every call computed as many blocks (up to rounding)
        return None
    sdd = max(0.0, sums.dd - mean_d * sums.d)
    if sdd <= _FLAT * sums.dd:
        sdd = 0.0
    sbd = sums.bd - mean_b * sums.d
    sbt = sums.bt - mean_b * sums.t
    sdt = sums.dt - mean_d * sums.t
    # the prior as ``weight`` calls whose blocks vary as these do, each on the prior's line
    ridge = weight * sbb / n
    sbb_r, sbt_r = sbb + ridge, sbt + ridge * prior
    if sdd <= 0.0:  # every call generated as many tokens: the block cost alone
        return max(0.0, sbt_r / sbb_r), 0.0
    det = sbb_r * sdd - sbd * sbd
    if det <= 1e-12 * sbb_r * sdd:  # tokens moved with blocks: the block cost alone
        return max(0.0, sbt_r / sbb_r), 0.0
    per_block = (sbt_r * sdd - sbd * sdt) / det
    per_token = (sbb_r * sdt - sbd * sbt_r) / det
    if per_token < 0.0:  # refit without it
        per_token, per_block = 0.0, sbt_r / sbb_r
    if per_block < 0.0:
        per_block = 0.0
        per_token = max(0.0, sdt / sdd)
    return per_block, per_token


_FLAT = 1e-9
"""A centred sum of squares this small beside its raw one is rounding: the values are equal."""


def _check_number(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(field, f"must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise UsageError(field, f"must be a finite number >= 0, got {value!r}")
