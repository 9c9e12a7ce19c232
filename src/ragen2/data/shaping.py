"""DAPO's overlong reward shaping and overlong filtering, per turn (docs/method.md §6).

``OverlongShaping.turn_terms`` gives, per turn, the ``overlong_penalty`` of that turn's sampled length
and whether the turn leaves the loss (it hit the token limit, ``finish_reason == "length"``, and
``filter`` is on); ``collate_episodes(turn_terms=…)`` lays them out, so the penalty flows into
``turn_rewards``, ``token_rewards`` and ``returns`` and every advantage estimator and dynamic sampling
see it.

Departures from DAPO / verl:
- DAPO shapes one response per prompt (verl: ``reward_model.overlong_buffer.{len,penalty_factor}``
  against ``max_response_length``). A multi-turn episode has one response per turn, and the sampler's
  limit is per turn (``rollout.max_new_tokens``), so we penalise and filter each turn on its own.
- DAPO's overlong filtering masks a whole truncated sample; we mask only the truncated turns. The
  episode's return still counts them (group statistics see the whole episode), and the rewards of a
  masked turn move to the previous turn still in the loss (the episode return to the last token still
  in the loss), since rewards off the loss mask are dropped by the token-level estimators. With γ = 1
  this is exactly treating the masked turn like env tokens. When no earlier turn is left in the loss,
  those rewards reach the update only through ``returns``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ragen2.agent.episode import Episode, Turn
from ragen2.algos.losses import overlong_penalty
from ragen2.errors import ConfigError

__all__ = ["OverlongShaping"]


@dataclass(frozen=True)
class OverlongStats:
    """What the overlong shaping did to one iteration's turns (shares of all turns): ``rollout/overlong_*``."""

    penalty_mean: float  # the mean penalty a turn got
    turns: float  # turns penalised
    filtered_turns: float  # truncated turns removed from the loss

    def as_metrics(self) -> dict[str, float]:
        return {f"rollout/overlong_{k}": v for k, v in vars(self).items()}


@dataclass(frozen=True)
class OverlongShaping:
    """Soft overlong punishment on each turn's length, and overlong filtering of truncated turns.

    A turn of L sampled tokens gains 0 for L ≤ max_len − cache_len, then a penalty falling linearly to
    −penalty at L = max_len (and −penalty beyond). ``max_len=None`` takes the rollout's
    ``max_new_tokens`` (``RolloutDataModule`` resolves it); ``filter`` drops turns that hit the limit
    from the loss mask.
    """

    cache_len: int
    """The band before ``max_len`` over which the penalty grows (0 = a hard cut at max_len)."""
    penalty: float = 1.0
    """The penalty at ``max_len`` and beyond (≥ 0: the turn's reward gains −penalty)."""
    max_len: int | None = None
    """The turn length of the full penalty (null = ``rollout.max_new_tokens``)."""
    filter: bool = True
    """Drop turns cut at the token limit from the loss mask."""

    def __post_init__(self) -> None:
        if self.cache_len < 0:
            raise ConfigError(
                f"algo.shaping.cache_len={self.cache_len} must be ≥ 0 (0 = a hard cut at max_len). "
                "Fix: e.g. algo.shaping.cache_len=16, a quarter of rollout.max_new_tokens."
            )
        if self.penalty < 0:
            raise ConfigError(
                f"algo.shaping.penalty={self.penalty} must be ≥ 0 (it is subtracted). Fix: algo.shaping.penalty=1.0"
            )
        if self.max_len is not None and self.max_len <= 0:
            raise ConfigError(
                f"algo.shaping.max_len={self.max_len} must be > 0. Fix: algo.shaping.max_len=null (the "
                "rollout's max_new_tokens)"
            )
        if self.max_len is not None and self.cache_len > self.max_len:
            raise ConfigError(
                f"algo.shaping.cache_len={self.cache_len} exceeds algo.shaping.max_len={self.max_len}. "
                "Fix: lower algo.shaping.cache_len or raise algo.shaping.max_len."
            )

    def resolve(self, max_new_tokens: int) -> OverlongShaping:
        """This shaping with ``max_len`` filled in from the rollout's ``max_new_tokens`` when unset."""
        if self.max_len is not None:
            return self
        if self.cache_len > max_new_tokens:
            raise ConfigError(
                f"algo.shaping.cache_len={self.cache_len} exceeds rollout.max_new_tokens={max_new_tokens} "
                "(the default algo.shaping.max_len). Fix: lower algo.shaping.cache_len or set "
                "algo.shaping.max_len."
            )
        return replace(self, max_len=max_new_tokens)

    def _limit(self) -> int:
        if self.max_len is None:
            raise ConfigError(
                "OverlongShaping.max_len is unset: call .resolve(max_new_tokens) first (RolloutDataModule does)"
            )
        return self.max_len

    def turn_penalties(self, episodes: Sequence[Episode]) -> list[list[float]]:
        """Per episode, per turn: the overlong penalty (≤ 0) of the turn's sampled length."""
        lengths = torch.tensor([len(t.sampled_ids) for ep in episodes for t in ep.turns], dtype=torch.float32)
        flat = overlong_penalty(lengths, self._limit(), self.cache_len, self.penalty).tolist()
        out, at = [], 0
        for ep in episodes:
            out.append(flat[at : at + len(ep.turns)])
            at += len(ep.turns)
        return out

    def _filtered(self, turn: Turn) -> bool:
        return self.filter and turn.finish_reason == "length" and turn.end > turn.start

    def turn_terms(self, episodes: Sequence[Episode]) -> list[list[tuple[float, bool]]]:
        """Per episode, per turn: (overlong penalty, leaves the loss) for ``collate_episodes(turn_terms=…)``."""
        return [
            [(p, self._filtered(turn)) for turn, p in zip(ep.turns, pens, strict=True)]
            for ep, pens in zip(episodes, self.turn_penalties(episodes), strict=True)
        ]

    def stats(self, episodes: Sequence[Episode]) -> OverlongStats:
        """Over all turns: the mean penalty, the share penalised, the share removed from the loss."""
        pens = [p for ep_pens in self.turn_penalties(episodes) for p in ep_pens]
        turns = [t for ep in episodes for t in ep.turns]
        n = max(1, len(turns))
        return OverlongStats(
            penalty_mean=sum(pens) / n,
            turns=sum(p < 0 for p in pens) / n,
            filtered_turns=sum(self._filtered(t) for t in turns) / n,
        )
