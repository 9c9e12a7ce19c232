"""``algo.*`` as one validated object: what an algorithm is (docs/method.md §6) and how its update runs.

``conf/algo/<name>.yaml`` fills it: an advantage estimator, a policy objective, optionally a critic
(PPO) and KL in the reward, the rollout-side steps DAPO adds (``sampling``, ``shaping``: the DataModule
reads them), and any of the shared update settings of ``conf/base/algo.yaml``. Every value is checked
here, when the config is instantiated, before any model loads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ragen2.algos.filters import LOSS_SCALINGS
from ragen2.algos.kl import KL_KINDS
from ragen2.algos.losses import AGG_MODES
from ragen2.errors import ConfigError
from ragen2.modules.critic import Critic
from ragen2.modules.estimators import AdvantageEstimator, KLInReward
from ragen2.modules.objectives import PolicyObjective
from ragen2.settings import settings

#: where the update's old log-probs come from (``algo.old_logprobs``)
OLD_LOGPROBS = ("recompute", "sampler")
#: what a mini-batch is drawn from (``algo.minibatch``)
MINIBATCHES = ("rows", "groups")


@dataclass(frozen=True)
class OptimConfig:
    """``algo.optim``: AdamW over the policy's parameters (a critic adds a group of its own)."""

    lr: float = 1e-6
    """Learning rate of the policy."""
    weight_decay: float = 0.01
    """AdamW's decoupled weight decay of the policy's parameters."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's (β1, β2): the decay rates of its gradient and squared-gradient averages, each in [0, 1)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up over this many optimizer steps (0 = none)."""
    grad_clip: float = 1.0
    """Largest global gradient norm of the policy's parameters (0 = no clipping)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))
        checks = (
            ("lr", self.lr, self.lr > 0, "algo.optim.lr=1e-6"),
            ("weight_decay", self.weight_decay, self.weight_decay >= 0, "algo.optim.weight_decay=0.01"),
            (
                "betas",
                list(self.betas),
                len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
                "algo.optim.betas=[0.9,0.999]",
            ),
            ("warmup_steps", self.warmup_steps, self.warmup_steps >= 0, "algo.optim.warmup_steps=0"),
            ("grad_clip", self.grad_clip, self.grad_clip >= 0, "algo.optim.grad_clip=1.0 (0 = no clipping)"),
        )
        for key, value, ok, fix in checks:
            if not ok:
                raise ConfigError(f"algo.optim.{key}={value} is out of range. Fix: {fix}")


@dataclass(frozen=True)
class TISConfig:
    """``algo.tis``: truncated importance sampling against the sampler–trainer mismatch (docs/method.md §6)."""

    cap: float | None = None
    """Largest importance weight π_old/π_sampler per token (null = off; verl's usual setting is 2)."""

    def __post_init__(self) -> None:
        if self.cap is not None and not self.cap > 0:
            raise ConfigError(
                f"algo.tis.cap={self.cap} must be > 0: it is the largest importance weight. "
                "Fix: algo.tis.cap=2 (or null to turn the correction off)"
            )


@dataclass(frozen=True)
class AlgoConfig:
    """``algo.*``: the algorithm. The update reads everything but ``sampling`` and ``shaping``."""

    advantage: AdvantageEstimator
    """Episodes -> [B, T] advantages (``ragen2.modules.estimators``); GAE needs a critic."""
    policy_loss: PolicyObjective
    """The task term (``ragen2.modules.objectives``): clipped surrogate, GSPO, …"""
    name: str = ""
    """A label for logs and run names."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The policy's optimizer (``algo.optim.lr`` …)."""
    loss_agg: str = "token-mean"
    """How token terms become one loss: token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm."""
    loss_norm: float | None = None
    """The constant of seq-mean-token-sum-norm (null = the mask's width)."""
    entropy_coef: float = 0.001
    """Weight of the entropy bonus: the loss adds −entropy_coef · entropy."""
    kl_coef: float = 0.0
    """> 0 adds kl_coef · KL(kl_kind) to a frozen reference model to the loss (the reference then loads)."""
    kl_kind: str = "low_var_kl"
    """KL estimator of the loss term: k1 | abs | k2 (mse) | k3 (low_var_kl), and the "+" straight-through variants."""
    kl_reward: KLInReward | None = None
    """KL in the reward instead (or too): ``algo/kl_reward=fixed|adaptive``."""
    critic: Critic | None = None
    """PPO's critic (``algo/critic=value_head|separate``); null for critic-free algorithms."""
    epochs: int = 1
    """Passes over the kept batch per iteration."""
    mini_batch_size: int = 8
    """Episodes per optimizer step (fixed: fewer kept groups, fewer steps)."""
    max_tokens_per_micro_batch: int = 4096
    """Padded tokens per forward/backward."""
    share_prompt_prefix: bool = False
    """Run a prompt that several rows of a micro-batch share (a group's rollouts) once in the update's
    forwards, its gradient summed over the rows: equal up to float rounding, far fewer tokens on
    single-turn tasks. Under gradient checkpointing only where the rows pack into one forward
    (``ragen2.models.forward``; else the plain pass); not under FSDP (refused)."""
    loss_scaling: str = "none"
    """Scale the advantages by the filter's kept ratio: none | linear | sqrt."""
    max_empty_iterations: int = 10
    """Stop after this many consecutive iterations whose filter kept no group (0 = never stop)."""
    max_nonfinite_steps: int = 3
    """Stop with an error after this many consecutive optimizer steps skipped for a non-finite loss or
    gradient norm (0 = skip them without stopping)."""
    tis: TISConfig = field(default_factory=TISConfig)
    """Truncated importance sampling of the policy loss by π_old/π_sampler (``algo.tis.cap``; off by default)."""
    minibatch: str = "rows"
    """rows: each mini-batch a seeded draw of the kept rows; groups: of whole kept groups (a group's rollouts stay
    together, so ``share_prompt_prefix`` runs each prompt once per step instead of the prefix all rows share)."""
    old_logprobs: str = "recompute"
    """recompute: the old log-probs from a forward of the training model before the first step (the default,
    whatever sampled); sampler: the sampler's own, saving that forward: exact up to rounding only when the
    sampler runs the training model itself at its precision (rollout=hf on fp32, experiment=organism)."""
    sampling: Any = None
    """DAPO's dynamic sampling (``ragen2.data.DynamicSampling``), read by the DataModule."""
    shaping: Any = None
    """DAPO's overlong shaping (``ragen2.data.OverlongShaping``), read by the DataModule."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "optim", settings(OptimConfig, self.optim, "algo.optim"))
        object.__setattr__(self, "tis", settings(TISConfig, self.tis, "algo.tis"))
        if self.advantage.needs_values and self.critic is None:
            raise ConfigError(
                f"algo.advantage={type(self.advantage).__name__} needs a critic's values, and algo.critic is "
                "null. Fix: use algo=ppo (a value head on the policy's trunk), or a critic-free estimator."
            )
        if self.critic is not None and not self.advantage.needs_values:
            raise ConfigError(
                f"algo.critic is set, but algo.advantage={type(self.advantage).__name__} does not use a "
                "critic's values, so the critic would never learn. Fix: use GAEAdvantage (algo=ppo), "
                "or drop the critic."
            )
        choices = (
            ("loss_agg", self.loss_agg, AGG_MODES),
            ("kl_kind", self.kl_kind, KL_KINDS),
            ("loss_scaling", self.loss_scaling, LOSS_SCALINGS),
            ("old_logprobs", self.old_logprobs, OLD_LOGPROBS),
            ("minibatch", self.minibatch, MINIBATCHES),
        )
        for key, value, allowed in choices:
            if value not in allowed:
                raise ConfigError(f"algo.{key}={value!r} is unknown. Fix: choose one of {', '.join(allowed)}")
        ranges = (
            (
                "loss_norm",
                self.loss_norm,
                self.loss_norm is None or self.loss_norm > 0,
                "a token count > 0, or null",
            ),
            (
                "entropy_coef",
                self.entropy_coef,
                math.isfinite(self.entropy_coef) and abs(self.entropy_coef) < 1,
                "a number in (−1, 1), e.g. 0.001 (the loss adds −entropy_coef · entropy, a few nats a token: "
                "at 1 the bonus outweighs any task term)",
            ),
            ("kl_coef", self.kl_coef, self.kl_coef >= 0, "≥ 0 (0 = no KL term in the loss)"),
            ("epochs", self.epochs, self.epochs >= 1, "≥ 1"),
            ("mini_batch_size", self.mini_batch_size, self.mini_batch_size >= 1, "≥ 1 episode"),
            (
                "max_tokens_per_micro_batch",
                self.max_tokens_per_micro_batch,
                self.max_tokens_per_micro_batch >= 1,
                "≥ 1 token, e.g. 4096",
            ),
            (
                "max_empty_iterations",
                self.max_empty_iterations,
                self.max_empty_iterations >= 0,
                "≥ 0 (0 = never stop)",
            ),
            (
                "max_nonfinite_steps",
                self.max_nonfinite_steps,
                self.max_nonfinite_steps >= 0,
                "≥ 0, e.g. 3 (0 = never stop)",
            ),
        )
        for key, value, ok, fix in ranges:
            if not ok:
                raise ConfigError(f"algo.{key}={value} is out of range. Fix: algo.{key} {fix}")

    @property
    def needs_reference(self) -> bool:
        """Whether a frozen reference model is needed (a KL term in the loss or in the reward)."""
        return self.kl_coef > 0 or self.kl_reward is not None
