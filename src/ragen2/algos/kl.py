"""Per-token KL estimators to a reference policy and KL-coefficient controllers.

Mirrors verl's `kl_penalty` (Schulman's k1/k2/k3 estimators, http://joschu.net/blog/kl-approx.html,
with k3 clamped to [−10, 10] after clamping its log-ratio to ±20) including the straight-through
"+" variants: the forward value of the named estimator with the gradient of k2, whose gradient is the
unbiased estimate of ∇KL. `AdaptiveKLController` is Ziegler et al. (2019)'s proportional controller
as in verl. Departure: unknown kinds raise ValueError with the choices (verl raises a bare
NotImplementedError), and every "+" spelling is accepted ("k2+"/"mse+" equal k2).
"""

from __future__ import annotations

import math

import torch

__all__ = ["KL_KINDS", "AdaptiveKLController", "FixedKLController", "kl_penalty"]

_BASE_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
KL_KINDS = _BASE_KINDS + tuple(f"{k}+" for k in _BASE_KINDS)


def _forward(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in ("k1", "kl"):
        return logp - ref_logp
    if kind == "abs":
        return (logp - ref_logp).abs()
    if kind in ("k2", "mse"):
        return 0.5 * (logp - ref_logp).square()
    # k3 = r − log r − 1 with r = π_ref/π: non-negative, unbiased, low variance.
    log_r = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.clamp(torch.exp(log_r) - log_r - 1.0, -10.0, 10.0)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Elementwise KL(π‖π_ref) estimate from sampled-token log-probs, any shape (e.g. [B, T])."""
    if kind not in KL_KINDS:
        raise ValueError(
            f"unknown KL estimator {kind!r} (algo.kl_kind, algo.kl_reward.kind). Fix: choose one of {KL_KINDS}"
        )
    if logp.shape != ref_logp.shape:
        raise ValueError(f"kl_penalty: logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ")
    base = kind.removesuffix("+")
    value = _forward(logp, ref_logp, base)
    if not kind.endswith("+") or base in ("k2", "mse"):
        return value
    k2 = 0.5 * (logp - ref_logp).square()
    return k2 - k2.detach() + value.detach()


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
