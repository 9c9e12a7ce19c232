"""Per-iteration rollout table: a few rendered episodes as Markdown (and a wandb Table when wandb logs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from ragen2.data.batch import RolloutBatch


def render_episode(episode: Any, decode: Any = None) -> str:
    """One episode as Markdown: each turn's observation, response, actions, reward and penalty."""
    lines = [
        f"### group {episode.group} · sample {episode.sample} · seed {episode.seed} · return "
        f"{episode.episode_return:+.2f} · success {episode.success} · end {episode.end_reason}",
    ]
    for n, t in enumerate(episode.turns, start=1):
        lines += [
            f"**turn {n}** state:",
            "```",
            t.observation,
            "```",
            f"response ({len(t.sampled_ids)} tokens, {t.finish_reason}): `<think>{t.text}`",
            f"actions {t.actions} valid {t.actions_valid} · reward {t.reward:+.2f} · penalty {t.penalty:+.2f}",
            "",
        ]
    return "\n".join(lines)


class RolloutTable(L.Callback):
    def __init__(self, num_episodes: int = 4) -> None:
        self.num_episodes = num_episodes

    @rank_zero_only
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(batch, RolloutBatch):
            return
        # one episode per group first, so the table shows different instances
        firsts = [ep for ep in batch.episodes if ep.sample == 0]
        chosen = (firsts + [ep for ep in batch.episodes if ep.sample != 0])[: self.num_episodes]
        folder = Path(trainer.default_root_dir) / "rollouts"
        folder.mkdir(parents=True, exist_ok=True)
        text = f"# iteration {batch.iteration}\n\n" + "\n\n".join(render_episode(ep) for ep in chosen)
        (folder / f"iteration_{batch.iteration:05d}.md").write_text(text)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                # the table log_text makes, with cells of any type (log_text's are annotated as text)
                logger.log_table(
                    key="rollout/episodes",
                    columns=["group", "sample", "return", "success", "transcript"],
                    data=[
                        [ep.group, ep.sample, ep.episode_return, ep.success, render_episode(ep)]
                        for ep in chosen
                    ],
                    step=trainer.global_step,
                )
