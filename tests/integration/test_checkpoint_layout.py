"""A last.ckpt written in the first checkpoint layout still resumes, exactly like running on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ragen2.modules.run_state import migrate

LEGACY = json.loads((Path(__file__).parent / "legacy_checkpoint_layout.json").read_text())
ALGOS = {"grpo": ["algo=grpo"], "ppo": ["algo=ppo", "algo/kl_reward=adaptive"]}


def to_first_layout(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A current checkpoint rewritten the way the first layout stored it: the MI metric's EMA in the
    module's state dict, no layout number, no saved run settings."""
    old = dict(checkpoint)
    # the first layout's only stateful callbacks (the collapse monitor came later)
    first = ("LastCheckpoint", "MIDiagnostics")
    callbacks = {k: v for k, v in old["callbacks"].items() if k.split("{")[0] in first}
    old["callbacks"] = callbacks
    state_dict = dict(old["state_dict"])
    state_dict["mi_first_turn._extra_state"] = callbacks.pop("MIDiagnostics")["first_turn"]
    old["state_dict"] = state_dict
    old["ragen2"] = {k: v for k, v in old["ragen2"].items() if k in ("empty_streak", "kl_reward_coef", "rng")}
    del old["RolloutDataModule"]
    return old


def layout_of(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The structure the fixture records, read off a checkpoint."""
    return {
        "top_level": sorted(checkpoint),
        "ragen2": sorted(checkpoint["ragen2"]),
        "rng": sorted(checkpoint["ragen2"]["rng"]),
        "state_dict_not_policy": sorted(k for k in checkpoint["state_dict"] if not k.startswith("policy.")),
        "mi_extra_state": sorted(checkpoint["state_dict"]["mi_first_turn._extra_state"]),
        "callbacks": sorted(k.split("{")[0] for k in checkpoint["callbacks"]),
        "optimizer_groups": [g["name"] for g in checkpoint["optimizer_states"][0]["param_groups"]],
    }


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_first_layout_checkpoint_resumes_like_running_on(algo: str, train, tmp_path: Path) -> None:
    straight, cfg_a = train(["iterations=2", *ALGOS[algo]], name="straight")
    _, cfg_b = train(["iterations=1", *ALGOS[algo]], name="first")
    current = torch.load(Path(cfg_b.run_dir) / "checkpoints" / "last.ckpt", weights_only=False)
    legacy = to_first_layout(current)
    assert layout_of(legacy) == LEGACY[algo]  # the rebuilt file is laid out as the real old ones were
    path = tmp_path / "first_layout.ckpt"
    torch.save(legacy, path)
    resumed, cfg_c = train(["iterations=2", f"ckpt_path={path}", *ALGOS[algo]], name="resumed")
    a = torch.load(Path(cfg_a.run_dir) / "checkpoints" / "last.ckpt", weights_only=False)
    c = torch.load(Path(cfg_c.run_dir) / "checkpoints" / "last.ckpt", weights_only=False)
    assert a["state_dict"].keys() == c["state_dict"].keys()
    for k, v in a["state_dict"].items():
        assert torch.equal(v, c["state_dict"][k]), k
    assert a["callbacks"]["MIDiagnostics"] == c["callbacks"]["MIDiagnostics"]  # the EMA moved and went on
    assert a["ragen2"]["kl_reward_coef"] == c["ragen2"]["kl_reward_coef"]
    for key in ("train/loss", "train/grad_norm", "diag/first_turn/mi_zscore_ema", "rollout/return"):
        assert resumed[key] == straight[key], key


def test_migrate_moves_the_mi_ema_to_its_callback() -> None:
    ema = {"ema_decay": 0.9, "sigma_ema": 0.5, "sigma_ema_seq": 2.0}
    checkpoint = {"state_dict": {"mi_first_turn._extra_state": ema, "policy.w": torch.zeros(1)}, "ragen2": {}}
    assert migrate(checkpoint) == [
        "state_dict['mi_first_turn._extra_state'] -> callbacks['MIDiagnostics']['first_turn']"
    ]
    assert checkpoint["callbacks"]["MIDiagnostics"] == {"first_turn": ema}
    assert list(checkpoint["state_dict"]) == ["policy.w"] and checkpoint["ragen2"]["layout"] == 2
    assert migrate(checkpoint) == []  # a current checkpoint is left as it is
