"""Per-token KL estimators to a reference policy and KL-coefficient controllers.

Mirrors verl's `kl_penalty` (Schulman's k1/k2/k3 estimators, http://joschu.net/blog/kl-approx.html,
with k3 clamped to [−10, 10] after clamping its log-ratio to ±20) including the straight-through
"+" variants: the forward value of the named estimator with the gradient of k2, whose gradient is the
unbiased estimate of ∇KL. `AdaptiveKLController` is Ziegler et al. (2019)'s proportional controller
as in verl. Departure: unknown kinds raise ValueError with the choices (verl raises a bare
NotImplementedError), and every "+" spelling is accepted ("k2+"/"mse+" equal k2).

Each estimator, and its "+" variant, is an entry of ``ragen2.plugins.KL_ESTIMATORS``; a package registers
one of its own with ``@plugins.kl_estimator`` (and its straight-through variant, ``straight_through``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ragen2 import plugins

__all__ = ["KL_KINDS", "AdaptiveKLController", "FixedKLController", "kl_penalty", "straight_through"]

#: algo.kl_kind's choices (``ragen2.plugins.KL_ESTIMATORS``)
KL_KINDS = plugins.KL_ESTIMATORS
Estimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def _abs(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return (logp - ref_logp).abs()


def _k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - ref_logp).square()


def _k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    # k3 = r − log r − 1 with r = π_ref/π: non-negative, unbiased, low variance.
    log_r = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.clamp(torch.exp(log_r) - log_r - 1.0, -10.0, 10.0)


def straight_through(estimator: Estimator) -> Estimator:
    """The "+" variant of ``estimator``: its value, with the gradient of k2 (the unbiased estimate of ∇KL)."""

    def plus(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        k2 = _k2(logp, ref_logp)
        return k2 - k2.detach() + estimator(logp, ref_logp).detach()

    return plus


def _register(estimators: dict[str, Estimator]) -> None:
    """Each estimator under its name, then each "+" variant (k2's gradient is its own: its "+" is k2)."""
    for name, estimator in estimators.items():
        plugins.kl_estimator(name)(estimator)
    for name, estimator in estimators.items():
        plugins.kl_estimator(f"{name}+")(estimator if estimator is _k2 else straight_through(estimator))


_register({"k1": _k1, "kl": _k1, "abs": _abs, "k2": _k2, "mse": _k2, "k3": _k3, "low_var_kl": _k3})


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Elementwise KL(π‖π_ref) estimate from sampled-token log-probs, any shape (e.g. [B, T])."""
    if kind not in KL_KINDS:
        raise ValueError(
            f"unknown KL estimator {kind!r} (algo.kl_kind, algo.kl_reward.kind). Fix: choose one of {KL_KINDS}"
        )
    if logp.shape != ref_logp.shape:
        raise ValueError(f"kl_penalty: logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ")
    return KL_KINDS[kind](logp, ref_logp)


class FixedKLController:
    """Constant KL coefficient; `update` is a no-op kept for the controller interface."""

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ValueError(f"algo.kl_reward.controller.kl_coef={kl_coef} must be ≥ 0. Fix: e.g. 0.001")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


class AdaptiveKLController:
    """β ← β·(1 + clip(KL/target − 1, ±0.2)·n_steps/horizon) (Ziegler et al. 2019, verl)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if init_kl_coef < 0:
            raise ValueError(
                f"algo.kl_reward.controller.init_kl_coef={init_kl_coef} must be ≥ 0. Fix: e.g. 0.001"
            )
        if target_kl <= 0:
            raise ValueError(f"algo.kl_reward.controller.target_kl={target_kl} must be > 0. Fix: e.g. 0.1")
        if horizon <= 0:
            raise ValueError(f"algo.kl_reward.controller.horizon={horizon} must be > 0. Fix: e.g. 10000")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move β toward the KL target; `n_steps` is the number of samples seen since the last update."""
        if not math.isfinite(current_kl):
            raise ValueError(f"AdaptiveKLController.update: current_kl must be finite, got {current_kl}")
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
