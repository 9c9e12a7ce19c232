"""Every conf/env/*.yaml runs one real training iteration (tiny model, scripted sampler with oracle moves)."""

from __future__ import annotations

from pathlib import Path

import pytest
from envs.adapted import ADAPTED

from ragen2.config import CONF_DIR

# the adapters of other packages' envs train one iteration in their own test files (tests/envs/adapted.py)
ENV_CONFIGS = sorted(p.stem for p in (CONF_DIR / "env").glob("*.yaml") if p.stem not in ADAPTED)
# an env that holds the reasoning to a grammar takes only its solver's reasoning as well-formed; TwoHop's first
# seeds are impossible instances (no solver move) at its default share of them
EXTRA = {
    "twohop": [
        "env.kwargs.zero_variance_share=0",
        "rollout.sampler.responses=['{reasoning}</think><answer>{oracle}</answer>',"
        "'{reasoning}</think><answer>v0</answer>','free words</think><answer>{oracle}</answer>']",
    ]
}


@pytest.mark.slow
@pytest.mark.parametrize("env", ENV_CONFIGS)
def test_env_config_trains_one_iteration(env: str, train, tmp_path: Path) -> None:
    overrides = [
        f"env={env}",
        "iterations=1",
        "rollout.groups=2",
        "rollout.group_size=3",
        "algo.mini_batch_size=6",
        *EXTRA.get(env, []),
    ]
    metrics, cfg = train(overrides, name=env)
    assert metrics["rollout/turns"] >= 1
    assert metrics["rollout/format_valid_rate"] > 0  # the oracle responses are well-formed
    # the oracle rollouts earn reward where the wrong or malformed ones do not: a group with signal
    assert metrics["filter/kept"] >= 1 and metrics["train/optimizer_steps"] >= 1, metrics
    assert (Path(cfg.run_dir) / "checkpoints" / "last.ckpt").is_file()
