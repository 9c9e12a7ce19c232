"""SFTModule: supervised fine-tuning of a causal LM on demonstrations, the warm start before RL.

The loss is the mean negative log-likelihood of the reply tokens over the batch (token-mean, as the RL
update's default aggregation): the demonstrations' loss mask (``ragen2.data.demo_datamodule``) covers every
turn's reply and nothing of the prompts, the env's observations or the template's turn markers. Log-probs
come from the update's own forward (``token_scores``: the decoder once, the LM head only where a reply token
is predicted), at temperature 1. One AdamW over the model's trainable parameters with a linear warm-up and
global-norm clipping; ``sft/loss``, ``sft/grad_norm`` and ``sft/lr`` are logged every step.

``save`` writes an HF folder (``save_pretrained``: weights, config, tokenizer with its chat template) that
``model.name_or_path=<folder>`` loads in every ragen2 program.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch

from ragen2.algos.logprobs import masked_mean
from ragen2.data.demo_datamodule import DemoBatch
from ragen2.errors import ConfigError
from ragen2.log import log
from ragen2.models.loading import ModelConfig
from ragen2.modules.update import clip, token_scores
from ragen2.settings import settings


@dataclass(frozen=True)
class SFTConfig:
    """``sft.*``: the fine-tuning run."""

    steps: int = 48
    """Optimizer steps (passes over the demonstrations repeat, reshuffled, as needed)."""
    batch_size: int = 8
    """Demonstration episodes per step."""
    lr: float = 1e-4
    """Learning rate (AdamW)."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up over this many steps (0 = none)."""
    grad_clip: float = 1.0
    """Largest global gradient norm (0 = no clipping)."""
    share_prompt_prefix: bool = True
    """Run the leading tokens that a batch's episodes share (the system prompt, the first user message's
    opening) once per step, as ``algo.share_prompt_prefix`` does: the same loss up to float rounding, at
    about half the tokens on the CPU."""

    def __post_init__(self) -> None:
        checks = (
            ("steps", self.steps, self.steps >= 1, "sft.steps=48"),
            ("batch_size", self.batch_size, self.batch_size >= 1, "sft.batch_size=8"),
            ("lr", self.lr, self.lr > 0, "sft.lr=1e-4"),
            ("weight_decay", self.weight_decay, self.weight_decay >= 0, "sft.weight_decay=0.0"),
            ("warmup_steps", self.warmup_steps, self.warmup_steps >= 0, "sft.warmup_steps=0"),
            ("grad_clip", self.grad_clip, self.grad_clip >= 0, "sft.grad_clip=1.0 (0 = no clipping)"),
        )
        for key, value, ok, fix in checks:
            if not ok:
                raise ConfigError(f"sft.{key}={value} is out of range. Fix: {fix}")


class SFTModule(L.LightningModule):
    """Fine-tunes ``model`` on ``DemoBatch``es; ``policy`` is the causal LM, ``losses`` every step's loss."""

    def __init__(self, model: ModelConfig | Mapping[str, Any], sft: SFTConfig | Mapping[str, Any]) -> None:
        super().__init__()
        self.model_cfg = settings(ModelConfig, model, "model")
        self.sft = settings(SFTConfig, sft, "sft")
        self.policy: Any = None
        self.losses: list[float] = []
        self._use_cache = True

    def configure_model(self) -> None:
        if self.policy is not None:
            return
        self.policy = self.model_cfg.load()
        self._use_cache = bool(self.policy.config.use_cache)
        self.policy.config.use_cache = False  # training forwards keep no keys/values
        self.policy.train()

    def configure_optimizers(self) -> Any:
        group = {
            "name": "policy",
            "params": [p for p in self.policy.parameters() if p.requires_grad],
            "max_norm": self.sft.grad_clip,
        }
        optimizer = torch.optim.AdamW([group], lr=self.sft.lr, weight_decay=self.sft.weight_decay)
        warmup = self.sft.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warmup + 1)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def training_step(self, batch: DemoBatch, batch_idx: int) -> torch.Tensor:
        _, logp, _ = token_scores(
            self.policy,
            batch.input_ids,
            batch.attention_mask,
            batch.loss_mask,
            1.0,
            with_entropy=False,
            share_prefix=self.sft.share_prompt_prefix,
        )
        loss = -masked_mean(logp, batch.loss_mask)
        lr = self.trainer.optimizers[0].param_groups[0]["lr"]
        self.log_dict(
            {"sft/loss": loss.detach(), "sft/lr": lr}, on_step=True, batch_size=len(batch.input_ids)
        )
        self.losses.append(float(loss.detach()))
        step, every = len(self.losses), max(1, self.sft.steps // 8)
        if step % every == 0 or step in (1, self.sft.steps):
            log.info("warm start step %d/%d: loss %.4f", step, self.sft.steps, self.losses[-1])
        return loss

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: Any = None,
        gradient_clip_algorithm: Any = None,
    ) -> None:
        """Clip to ``sft.grad_clip`` (the update's ``clip``) and log the norm before clipping."""
        self.log("sft/grad_norm", clip(optimizer.param_groups)["grad_norm"], on_step=True, batch_size=1)

    def save(self, folder: str | Path, tokenizer: Any) -> None:
        """The fine-tuned model and ``tokenizer`` as an HF folder (``save_pretrained``)."""
        self.policy.config.use_cache = self._use_cache
        self.policy.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
