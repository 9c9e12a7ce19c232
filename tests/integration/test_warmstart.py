"""ragen2-warmstart end to end on the tiny model: demonstrations through the agent loop, a few SFT steps, an HF
folder that loads; then one RL iteration of ragen2-train from that folder, on the prompts it trained on."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from ragen2.config import build, compose
from ragen2.data.demos import first_difference
from ragen2.models import load_model, load_tokenizer
from ragen2.train import run as train
from ragen2.warmstart import run as warmstart

pytestmark = pytest.mark.slow  # a warm start and an RL iteration: about a minute each on 2 busy cores

# FrozenLake 3×3 with coordinates (the pilot's env); a few steps at a large lr so the tiny model moves
ENV = ("env=frozenlake", "env.kwargs.size=3", "env.kwargs.observation=coord", "max_turns_cap=2")
WARM = (
    "model=tiny",
    "demos.episodes=12",
    "sft.steps=3",
    "sft.batch_size=4",
    "sft.lr=1e-3",
    "trainer.accelerator=cpu",
)


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], DictConfig]:
    cfg = compose([*ENV, *WARM], config_name="warmstart", run_dir=str(tmp_path_factory.mktemp("warm")))
    return warmstart(cfg), cfg


def test_the_warm_start_writes_a_folder_that_loads(warm: tuple[dict[str, Any], DictConfig]) -> None:
    record, cfg = warm
    folder = Path(cfg.output)
    assert record["folder"] == str(folder) and folder.parent == Path(cfg.run_dir)
    model, base = load_model(str(folder)), load_model("tiny")
    assert type(model) is type(base)
    changed = [n for n, p in model.state_dict().items() if not torch.equal(p, base.state_dict()[n])]
    assert len(changed) == len(base.state_dict())  # every weight was trained
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.chat_template == load_tokenizer("tiny").chat_template
    saved = json.loads((folder / "warmstart.json").read_text())
    assert saved == record
    assert (
        saved["demonstrations"] == 12 and saved["sft"]["steps"] == 3 and saved["env"]["kwargs"]["size"] == 3
    )
    assert saved["reply_tokens"] > 12 * 25  # a reasoning sentence and an answer per turn
    rows = list(csv.DictReader((Path(cfg.run_dir) / "csv" / "metrics.csv").open()))
    losses = [float(r["sft/loss"]) for r in rows]
    assert len(losses) == 3 and losses[0] == pytest.approx(saved["loss_first"])
    assert losses[-1] < losses[0]
    assert all(float(r["sft/grad_norm"]) > 0 for r in rows)


def test_one_rl_iteration_from_the_folder_on_the_prompts_it_trained_on(
    warm: tuple[dict[str, Any], DictConfig], tmp_path: Path
) -> None:
    _, warm_cfg = warm
    folder = warm_cfg.output
    cfg = compose(
        [
            *ENV,
            f"model.name_or_path={folder}",
            "rollout.groups=2",
            "rollout.group_size=2",
            "algo.mini_batch_size=4",
            "algo.optim.lr=1e-3",
            "iterations=1",
            "diagnostics.every_n_iterations=0",
            "trainer.limit_val_batches=0",
        ],
        run_dir=str(tmp_path / "rl"),
    )
    # the RL run's episode runner renders the warm start's demonstrations into the very same ids
    demos = build(warm_cfg.data)
    demos.setup()
    rollouts = build(cfg.data)
    rollouts.setup()
    assert first_difference(demos.episodes, rollouts.runner, demos.demos, warm_cfg.seed) is None
    metrics = train(cfg)
    assert metrics["train/iteration"] == 0.0
    assert metrics["rollout/turns"] >= 1.0 and 0.0 <= metrics["rollout/format_valid_rate"] <= 1.0
    checkpoint = torch.load(tmp_path / "rl" / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["ragen2"]["model"]["name_or_path"] == folder  # the run's base model is the warm start
