"""One fixed set of episodes trained on 1 or 2 ranks; launched as a script by test_multirank.py.

    python tests/integration/multirank_update.py <folder> <run> [<run> ...]
    <run>: <trainer: cpu | ddp | fsdp>[+poison][+lora], e.g. ddp+lora

The runs go one after another in the same processes (one launch, one import of everything; the process
group the first distributed fit makes serves the others), each writing ``<folder>/<run>.pt``. A launch
holds the one-rank runs (cpu) or the two-rank ones (ddp, fsdp), not both.

The iteration's 8 groups × 4 episodes are a pure function of their instance seeds, so every world size
trains on the same episodes. Groups 0, 1, 2 and 4 vary in reward and the filter keeps exactly those: 3
groups on rank 0 (groups 0–3) and 1 on rank 1 (groups 4–7). Episode lengths vary and micro-batches are
small, so the ranks also run different numbers of micro-batches. Rank 0 saves the first optimizer
step's (all-reduced) gradients, the final parameters and every iteration's logged metrics; every other
rank saves its own final parameters and metrics to ``<run>.pt.rank<r>``.

``poison``: rank 1's first micro-batch has a NaN loss whose gradient stays finite (``tests/poisoned.py``,
``kind=loss``), so only the ranks' shared finiteness flag can tell rank 0 to skip that step.
``lora``: the policy trains LoRA adapters (``model/lora=default``) on its frozen base, with a KL term to the
reference, the base with the adapters off (scored on every rank, sharded under FSDP).
"""

from __future__ import annotations

import sys
from typing import Any

import lightning as L
import torch

from ragen2.agent.episode import Episode, Turn
from ragen2.config import build, compose, validate
from ragen2.data import RolloutDataModule

GROUPS, SIZE = 8, 4
VARIED = {0, 1, 2, 4}


def _episode(global_group: int, local_group: int, sample: int, seed: int) -> Episode:
    gen = torch.Generator().manual_seed(seed * 97 + sample)
    prompt = torch.randint(
        10, 2000, (int(torch.randint(6, 14, (1,), generator=gen)),), generator=gen
    ).tolist()
    sampled = torch.randint(
        10, 2000, (int(torch.randint(3, 10, (1,), generator=gen)),), generator=gen
    ).tolist()
    reward = float(sample % 2) if global_group in VARIED else 0.5
    turn = Turn(
        prompt_ids=prompt,
        sampled_ids=sampled,
        sampler_logprobs=[-1.0] * len(sampled),
        text="",
        finish_reason="stop",
        observation="",
        format_ok=True,
        actions=["a"],
        actions_valid=[True],
        reward=reward,
        penalty=0.0,
        reasoning_ids=sampled[:2],
    )
    return Episode(
        env_id="fixed", seed=seed, group=local_group, sample=sample, system_prompt="", turns=[turn]
    )


class FixedEpisodes(RolloutDataModule):
    """The real DataModule (seeds, global filter, metrics) over episodes fixed by their instance seeds."""

    def collect(self, seeds: list[int], sample_seed: int) -> list[Episode]:
        # round 0's seeds
        iteration, first = divmod(seeds[0] - self.seed * 1_000_003, self.rollout_cfg.groups)
        return [
            _episode(first + g, g, k, seed + iteration * 1000)
            for g, seed in enumerate(seeds)
            for k in range(SIZE)
        ]


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


class Recorder(L.Callback):
    def __init__(self, out: str) -> None:
        self.out = out
        self.grads: dict[str, torch.Tensor] | None = None
        self.metrics: list[dict[str, float]] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.initial = {n: _full(p) for n, p in pl_module.policy.named_parameters()}

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: Any, optimizer: Any) -> None:
        if self.grads is None:
            self.grads = {
                n: _full(p.grad) for n, p in pl_module.policy.named_parameters() if p.grad is not None
            }

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        self.metrics.append(dict(pl_module.last_metrics))

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        params = {n: _full(p) for n, p in pl_module.policy.named_parameters()}
        if trainer.is_global_zero:
            saved = {"grads": self.grads, "initial": self.initial, "params": params, "metrics": self.metrics}
            torch.save(saved, self.out)
        else:
            torch.save({"params": params, "metrics": self.metrics}, f"{self.out}.rank{trainer.global_rank}")


POISON = (
    "algo.policy_loss._target_=poisoned.PoisonedLoss",
    "+algo.policy_loss.calls=[0]",
    "+algo.policy_loss.rank=1",
    "+algo.policy_loss.kind=loss",
)


def main(trainer_name: str, out: str, poison: bool = False, lora: bool = False) -> None:
    cfg = compose(
        [
            f"trainer={trainer_name}",
            *(["trainer.devices=2"] if trainer_name != "cpu" else []),
            "model=tiny",
            "rollout=scripted",
            f"rollout.groups={GROUPS}",
            f"rollout.group_size={SIZE}",
            "filter.value=1.0",  # keep every group with reward variance, and only those
            "algo.optim.lr=1e-3",  # large enough that parameters tell a wrong gradient apart
            "algo.mini_batch_size=8",
            "algo.max_tokens_per_micro_batch=40",
            "iterations=2",
            "diagnostics.enabled=false",
            "trainer.limit_val_batches=0",
            *(POISON if poison else ()),
            *(["model/lora=default", "algo.kl_coef=0.05"] if lora else []),
        ],
        run_dir=out + ".run",
    )
    validate(cfg)
    L.seed_everything(0)
    cfg.data._target_ = f"{__name__}.FixedEpisodes"
    datamodule = build(cfg.data)
    module = build(cfg.module)
    trainer = build(cfg.trainer, callbacks=[Recorder(out)], logger=False, enable_checkpointing=False)
    trainer.fit(module, datamodule=datamodule)


if __name__ == "__main__":
    folder, runs = sys.argv[1], sys.argv[2:]
    if len({run.split("+")[0] == "cpu" for run in runs}) != 1:
        raise SystemExit(f"one launch runs on one world size: cpu runs or ddp/fsdp runs, not {runs}")
    for run in runs:  # every rank runs the same list (Lightning starts rank 1 with this command line)
        trainer_name, *extra = run.split("+")
        main(trainer_name, f"{folder}/{run}.pt", poison="poison" in extra, lora="lora" in extra)
