"""env.step_timeout_s from the config to the iteration's metrics: a hung env call in a DataModule rollout."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from envs.adapted import ADAPTED
from hydra.utils import instantiate
from ragen2_envs.sokoban.env import SokobanEnv

from ragen2.config import CONF_DIR, build, compose
from ragen2.data import GroupFilter, RolloutDataModule
from ragen2.data.batch import by_group
from ragen2.errors import ConfigError
from ragen2.rollout.scripted import ScriptedSampler

# the adapters of other packages' envs run this check in their own test files (tests/envs/adapted.py)
CONF_FILES = sorted(p for p in (CONF_DIR / "env").glob("*.yaml") if p.stem not in ADAPTED)


@pytest.mark.parametrize("path", CONF_FILES, ids=[p.stem for p in CONF_FILES])
def test_every_env_config_sets_the_runners_limit(path: Path, tokenizer) -> None:
    data = instantiate(compose([f"env={path.stem}", "model=tiny", "rollout=scripted"]).data)
    # DeepCoder's sandbox bounds each test and its launcher itself: no second limit around its step
    want = None if path.stem == "deepcoder" else 60
    assert data.rollout_cfg.runner(data.env, tokenizer).cfg.step_timeout_s == want


def test_the_limit_is_set_and_checked_from_the_command_line(tokenizer) -> None:
    data = instantiate(
        compose(["env=sokoban", "env.step_timeout_s=2.5", "model=tiny", "rollout=scripted"]).data
    )
    assert data.rollout_cfg.runner(data.env, tokenizer).cfg.step_timeout_s == 2.5
    bad = compose(["env=sokoban", "env.step_timeout_s=-1", "model=tiny", "rollout=scripted"]).data
    with pytest.raises(ConfigError, match=r"env\.step_timeout_s=-1 must be a number of seconds"):
        build(bad)


class StepHangsOnce(SokobanEnv):
    """Real Sokoban; rollout 1 of instance seed 0 never returns from its first step."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        self.hangs = (seed, (options or {}).get("sample", 0)) == (0, 1)
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        while self.hangs:
            pass
        return super().step(action)


@pytest.mark.timeout(60)  # without a limit the hung step never returns
def test_a_hung_step_is_a_counted_failure_of_the_iteration() -> None:
    dm = RolloutDataModule(
        env={"id": "ragen2/Sokoban-v0", "max_turns": 3, "max_actions_per_turn": 2, "step_timeout_s": 0.5},
        rollout={
            "sampler": functools.partial(
                ScriptedSampler, responses=["Plan.</think><answer>{oracle}</answer>"]
            ),
            "groups": 2,
            "group_size": 2,
            "max_new_tokens": 32,
        },
        tokenizer="tiny",
        filter=GroupFilter(strategy="top_p", value=0.9),
    )
    dm.setup()
    assert dm.runner is not None
    dm.runner.env_factory = StepHangsOnce
    batch = dm.rollout(0)
    assert batch.record.as_metrics()["rollout/env_timeouts"] == 1.0
    # seed 0's solver plan solves it in 3 turns of 2 moves: 11 − 0.1 · 5 = 10.5; the hung rollout's first
    # step never returned: return 0. Seed 1's two rollouts play the same plan: no variance.
    returns = by_group(batch.returns, batch.group_index, 2)
    assert returns[0].tolist() == pytest.approx([10.5, 0.0])
    assert returns[1, 0] == returns[1, 1]
    # the filter still selects over full groups: the one with reward variance is kept
    assert batch.keep.tolist() == [True, False]
    assert [ep.end_reason for ep in batch.episodes[:2]] == ["terminated", "env_timeout"]
