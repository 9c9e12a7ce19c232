"""Episodes -> the tensor batch the LightningModule trains on."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from ragen2.agent.episode import Episode
from ragen2.data.record import IterationRecord


class KeptShare(NamedTuple):
    """This rank's kept rows among every rank's: where the update's mini-batches find them, and the
    share of the iteration's rows trained (``algo.loss_scaling``, ``filter/kept_row_ratio``). Counted once,
    by ``GroupFilter.select_across``."""

    first: int  # global index of this rank's first kept row (ranks in order)
    kept: int  # kept rows over every rank
    rows: int  # rows over every rank

    @property
    def ratio(self) -> float:
        """The share of the iteration's rows the update trains on (for a group-level filter, the kept
        group ratio: groups are equal-sized)."""
        return self.kept / self.rows


class Grouped(Protocol):
    """What the filter reads of rollouts: each one's episode and return, and its group among G equal-sized
    ones (a ``RolloutBatch``, or the ``Groups`` an iteration selects from before its batch exists)."""

    @property
    def episodes(self) -> list[Episode]: ...

    @property
    def returns(self) -> torch.Tensor: ...  # [B]

    @property
    def group_index(self) -> torch.Tensor: ...  # [B]

    @property
    def num_groups(self) -> int: ...


@dataclass(frozen=True)
class Groups:
    """Episodes grouped for the filter: ``Grouped`` without the tensors of a batch."""

    episodes: list[Episode]
    returns: torch.Tensor  # [B] episode returns (turn rewards + format penalties + shaping)
    num_groups: int

    @classmethod
    def of(cls, episodes: Sequence[Episode], num_groups: int, turn_terms: TurnTerms | None = None) -> Groups:
        """The episodes with their returns (``turn_terms``: their shaping, as ``collate_episodes`` takes it)."""
        return cls(list(episodes), episode_returns(episodes, turn_terms), num_groups)

    @property
    def group_index(self) -> torch.Tensor:
        """[B] group of each episode, 0..G-1."""
        return torch.tensor([ep.group for ep in self.episodes], dtype=torch.long)


@dataclass(frozen=True)
class Selection:
    """What the filter chose of a batch's groups: the groups and rows the update trains on, and the kept
    share over every rank (None: the batch is the whole iteration)."""

    keep: torch.Tensor  # [G] bool: groups the update trains on
    scores: torch.Tensor  # [G] the filter's score per group
    # [B] bool: rows the update may train on within kept groups (a trajectory-level filter's choice)
    keep_rows: torch.Tensor
    share: KeptShare | None = None

    @classmethod
    def everything(cls, num_groups: int, rows: int) -> Selection:
        """Every group and row kept, unscored: a batch built by hand."""
        return cls(
            keep=torch.ones(num_groups, dtype=torch.bool),
            scores=torch.zeros(num_groups, dtype=torch.float64),
            keep_rows=torch.ones(rows, dtype=torch.bool),
        )


@dataclass(frozen=True)
class RolloutBatch:
    """One iteration's rollouts, built once (``collate_episodes``). B = groups × group_size episodes,
    T = the longest sequence."""

    input_ids: torch.Tensor  # [B, T] final sequences, right-padded
    attention_mask: torch.Tensor  # [B, T] 1 on real tokens
    loss_mask: torch.Tensor  # [B, T] 1 exactly where the policy sampled the token
    turn_index: torch.Tensor  # [B, T] turn number (1, 2, …) of tokens in the loss mask, 0 elsewhere
    # [B, T] the row's sequence (1, 2, …; 0 on padding) each token belongs to: one per row, or one per turn
    # where each turn is a sequence of its own (``Episode.sequences``), each run on its own context
    sequence_index: torch.Tensor
    sampler_logprobs: torch.Tensor  # [B, T] the sampler's log-prob of sampled tokens, NaN if unknown
    token_rewards: torch.Tensor  # [B, T] episode return on the last token in the loss mask
    # [B, T] each turn's reward + penalty on that turn's last sampled token (OverlongShaping moves a
    # turn it drops from the loss mask onto the previous turn still in it)
    turn_rewards: torch.Tensor
    returns: torch.Tensor  # [B] episode returns (turn rewards + format penalties + shaping)
    group_index: torch.Tensor  # [B] group of each episode, 0..G-1
    group_scores: torch.Tensor  # [G] the filter's score per group
    keep: torch.Tensor  # [G] bool: groups the update trains on
    # [B] bool: rows the update may train on within kept groups (a trajectory-level filter's choice);
    # all True for a group-level filter
    keep_rows: torch.Tensor
    episodes: list[Episode] = field(default_factory=list)
    iteration: int = 0
    # what this iteration's rollouts did, from before the update (``collect_iteration``); the module logs it
    # with its own numbers
    record: IterationRecord = field(default_factory=IterationRecord)
    # the kept rows counted over every rank (``GroupFilter.select_across``); None: this batch is the whole
    # iteration (one process, a batch built by hand)
    share: KeptShare | None = None

    @property
    def num_groups(self) -> int:
        return int(self.keep.numel())

    def kept_share(self) -> KeptShare:
        """This rank's kept rows among every rank's (``share``, or this batch's own when it is unset)."""
        if self.share is not None:
            return self.share
        return KeptShare(0, int(self.kept_rows.numel()), int(self.keep_rows.numel()))

    @property
    def kept_rows(self) -> torch.Tensor:
        """[B'] indices of the episodes the update trains on: in kept groups, and kept by ``keep_rows``."""
        return torch.nonzero(self.keep[self.group_index] & self.keep_rows, as_tuple=False).squeeze(-1)

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The batch with its tensors on ``device`` (Lightning moves a batch through its ``to``)."""
        moved = {
            f.name: value.to(device)
            for f in fields(self)
            if isinstance(value := getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **moved)

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """A view on some episodes (rows), trimmed to their longest sequence."""
        width = int(self.attention_mask[rows].sum(-1).max()) if rows.numel() else 0
        cut = {
            name: getattr(self, name)[rows, :width]
            for name in (
                "input_ids",
                "attention_mask",
                "loss_mask",
                "turn_index",
                "sequence_index",
                "sampler_logprobs",
                "token_rewards",
                "turn_rewards",
            )
        }
        return replace(
            self,
            **cut,
            returns=self.returns[rows],
            group_index=self.group_index[rows],
            keep_rows=self.keep_rows[rows],
            episodes=[self.episodes[int(r)] for r in rows],
        )


# Per episode, per turn: (reward added to the turn, whether the turn leaves the loss), e.g. DAPO's overlong
# shaping (``ragen2.data.OverlongShaping.turn_terms``).
TurnTerms = Sequence[Sequence[tuple[float, bool]]]


def collate_episodes(
    episodes: Sequence[Episode],
    num_groups: int,
    pad_id: int,
    iteration: int = 0,
    turn_terms: TurnTerms | None = None,
    selection: Selection | None = None,
    record: IterationRecord | None = None,
) -> RolloutBatch:
    """Lay episodes out as right-padded tensors; masks come from each turn's sampled span. ``selection``
    is the filter's choice (without one, every group and row is kept, unscored).

    Each turn's reward (+ penalty + its ``turn_terms`` reward) sits on its last sampled token and the
    episode return on the last sampled token still in the loss. A turn that leaves the loss hands its
    reward back to the previous turn still in it, so rewards never sit off the loss mask (the token-level
    estimators refuse that); with γ = 1 that is treating the turn like env tokens.
    """
    b = len(episodes)
    t = max(len(ep.token_ids) for ep in episodes)
    chosen = selection or Selection.everything(num_groups, b)
    # laid out in numpy arrays of the tensors' dtypes, then handed to torch as they are: a row's few
    # writes cost a tensor op each in torch (a tenth of the organism's rollout), a plain store here
    input_ids = np.full((b, t), pad_id, dtype=np.int64)
    attention = np.zeros((b, t), dtype=np.int64)
    loss_mask = np.zeros((b, t), dtype=np.float32)
    turn_index = np.zeros((b, t), dtype=np.int64)
    sequence_index = np.zeros((b, t), dtype=np.int64)
    sampler_lp = np.full((b, t), math.nan, dtype=np.float32)
    token_rewards = np.zeros((b, t), dtype=np.float32)
    turn_rewards = np.zeros((b, t), dtype=np.float32)
    returns = episode_returns(episodes, turn_terms)
    returned = returns.tolist()  # float32 values, exact as Python floats
    for i, ep in enumerate(episodes):
        ids = ep.token_ids
        input_ids[i, : len(ids)] = ids
        attention[i, : len(ids)] = 1
        for n, (start, end) in enumerate(ep.sequences, start=1):
            sequence_index[i, start:end] = n
        terms = turn_terms[i] if turn_terms is not None else [(0.0, False)] * len(ep.turns)
        anchor: int | None = None  # the last sampled position still in the loss
        for n, (turn, (extra, dropped)) in enumerate(zip(ep.turns, terms, strict=True), start=1):
            if turn.end == turn.start:  # an empty response samples nothing to train on
                continue
            if turn.sampler_logprobs is not None:
                sampler_lp[i, turn.start : turn.end] = turn.sampler_logprobs
            reward = turn.reward + turn.penalty + extra
            if dropped:
                if anchor is not None:
                    turn_rewards[i, anchor] += reward
                continue
            loss_mask[i, turn.start : turn.end] = 1.0
            turn_index[i, turn.start : turn.end] = n
            anchor = turn.end - 1
            turn_rewards[i, anchor] = reward
        if anchor is not None:
            token_rewards[i, anchor] = returned[i]
    return RolloutBatch(
        input_ids=torch.from_numpy(input_ids),
        attention_mask=torch.from_numpy(attention),
        loss_mask=torch.from_numpy(loss_mask),
        turn_index=torch.from_numpy(turn_index),
        sequence_index=torch.from_numpy(sequence_index),
        sampler_logprobs=torch.from_numpy(sampler_lp),
        token_rewards=torch.from_numpy(token_rewards),
        turn_rewards=torch.from_numpy(turn_rewards),
        returns=returns,
        group_index=torch.tensor([ep.group for ep in episodes], dtype=torch.long),
        group_scores=chosen.scores,
        keep=chosen.keep,
        keep_rows=chosen.keep_rows,
        episodes=list(episodes),
        iteration=iteration,
        record=record or IterationRecord(),
        share=chosen.share,
    )


def episode_returns(episodes: Sequence[Episode], turn_terms: TurnTerms | None = None) -> torch.Tensor:
    """[B] float32 episode returns: each episode's own plus its ``turn_terms`` rewards."""
    extras = [0.0] * len(episodes) if turn_terms is None else [sum(x for x, _ in t) for t in turn_terms]
    returns = [ep.episode_return + x for ep, x in zip(episodes, extras, strict=True)]
    return torch.tensor(returns, dtype=torch.float32)


def by_group(values: torch.Tensor, group_index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """[B] per-rollout values (e.g. returns) -> [G, K]; every group must hold the same number of episodes."""
    order = torch.argsort(group_index, stable=True)
    counts = torch.bincount(group_index, minlength=num_groups)
    if counts.numel() != num_groups or not bool((counts == counts[0]).all()):
        raise ValueError(
            f"groups have unequal sizes {counts.tolist()}; every group needs group_size episodes"
        )
    return values[order].view(num_groups, -1)


def ungroup(values: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """[G, K] per-group values -> [B] in batch row order: the inverse of ``by_group``."""
    order = torch.argsort(group_index, stable=True)
    out = torch.empty(group_index.numel(), dtype=values.dtype, device=values.device)
    out[order] = values.reshape(-1)
    return out


def describe(batch: RolloutBatch) -> dict[str, Any]:
    """A compact summary for notebooks and logs."""
    return {
        "episodes": len(batch.episodes),
        "groups": batch.num_groups,
        "kept_groups": int(batch.keep.sum()),
        "kept_rows": int(batch.kept_rows.numel()),
        "width": int(batch.input_ids.shape[1]),
        "sampled_tokens": int(batch.loss_mask.sum()),
        "mean_return": float(batch.returns.mean()),
    }
