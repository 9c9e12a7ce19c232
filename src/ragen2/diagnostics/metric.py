"""``MIMetric``: the MI proxies as a torchmetrics object the LightningModule owns."""

import math
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from ragen2.diagnostics.mi import matched_marginal, mi_metrics, per_token, validate_scores, zscore


class MIMetric(Metric):
    """MI proxies of the latest cross-scoring pass plus ``mi_zscore_ema`` / ``mi_zscore_ema_seq``.

    ``update`` stores the pass and advances the EMA of σ(marginal), one EMA per family (per token,
    per sequence): σ_t = d·σ_{t−1} + (1 − d)·σ_now, first value σ_now, updated before use. The EMA
    is run state: ``reset()`` keeps it and it travels in ``state_dict()`` (as the module's extra
    state, so dtype casts and device moves of the LightningModule leave it alone). Own one metric
    per pair-sampling family (first-turn, trajectory, turn t) so that each has its own EMA.

    Columns are the prompts of the rows it is given, so torchmetrics' gathering of stored rows across
    ranks would misalign them: ``sync_on_compute`` defaults to False. Under DDP/FSDP, ``MIDiagnostics``
    all-gathers the (X, Z) rows *before* cross-scoring instead, so every rank updates its metric with the
    same pass and holds the same EMA.
    """

    full_state_update = False
    logp_sum: Tensor
    prompt_index: Tensor
    num_tokens: Tensor

    def __init__(self, ema_decay: float = 0.9, **kwargs: Any) -> None:
        kwargs.setdefault("sync_on_compute", False)
        super().__init__(**kwargs)
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay must lie in [0, 1), got {ema_decay}; the reference uses 0.9")
        self.ema_decay = ema_decay
        self.sigma_ema: float | None = None
        self.sigma_ema_seq: float | None = None
        self.add_state("logp_sum", default=torch.zeros(0, 0), dist_reduce_fx=None)
        self.add_state("prompt_index", default=torch.zeros(0, dtype=torch.long), dist_reduce_fx=None)
        self.add_state("num_tokens", default=torch.zeros(0), dist_reduce_fx=None)

    def _advance(self, previous: float | None, now: float) -> float:
        return now if previous is None else self.ema_decay * previous + (1.0 - self.ema_decay) * now

    def update(self, logp_sum: Tensor, prompt_index: Tensor, num_tokens: Tensor) -> None:
        """Store one pass ([R, C], [R], [R]) and advance both σ EMAs with it."""
        validate_scores(logp_sum, prompt_index, num_tokens)
        self.logp_sum = logp_sum.detach().double()
        self.prompt_index = prompt_index.detach().long()
        self.num_tokens = num_tokens.detach().double()
        _, marginal = matched_marginal(per_token(self.logp_sum, self.num_tokens), self.prompt_index)
        _, marginal_seq = matched_marginal(self.logp_sum, self.prompt_index)
        self.sigma_ema = self._advance(self.sigma_ema, float(marginal.std(correction=0)))
        self.sigma_ema_seq = self._advance(self.sigma_ema_seq, float(marginal_seq.std(correction=0)))

    def compute(self) -> dict[str, float]:
        """``mi_metrics`` of the latest pass plus the EMA z-scores."""
        if self.logp_sum.numel() == 0 or self.sigma_ema is None or self.sigma_ema_seq is None:
            raise RuntimeError("MIMetric.compute() called with no stored pass; call update() first")
        out = mi_metrics(self.logp_sum, self.prompt_index, self.num_tokens)
        matched, marginal = matched_marginal(per_token(self.logp_sum, self.num_tokens), self.prompt_index)
        matched_seq, marginal_seq = matched_marginal(self.logp_sum, self.prompt_index)
        out["mi_zscore_ema"] = zscore(matched, marginal, self.sigma_ema)
        out["mi_zscore_ema_seq"] = zscore(matched_seq, marginal_seq, self.sigma_ema_seq)
        return out

    def forward(self, logp_sum: Tensor, prompt_index: Tensor, num_tokens: Tensor) -> dict[str, float]:
        """``update`` then ``compute``: torchmetrics' default forward would replay ``update``
        and so advance the EMA twice for one pass."""
        self.update(logp_sum, prompt_index, num_tokens)
        return self.compute()

    def get_extra_state(self) -> dict[str, float | None]:
        """The EMA, saved with the checkpoint."""
        return {"ema_decay": self.ema_decay, "sigma_ema": self.sigma_ema, "sigma_ema_seq": self.sigma_ema_seq}

    def set_extra_state(self, state: dict[str, float | None]) -> None:
        """Restore the EMA saved by ``get_extra_state``."""
        missing = {"ema_decay", "sigma_ema", "sigma_ema_seq"} - set(state)
        if missing:
            raise ValueError(f"MIMetric extra state lacks {sorted(missing)}; was it saved by MIMetric?")
        decay = state["ema_decay"]
        if decay is None or not math.isclose(decay, self.ema_decay):
            raise ValueError(
                f"checkpoint's ema_decay {decay} differs from this metric's {self.ema_decay}; "
                "build MIMetric with the decay the run was started with"
            )
        self.sigma_ema = state["sigma_ema"]
        self.sigma_ema_seq = state["sigma_ema_seq"]
