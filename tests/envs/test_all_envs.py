"""The environment contract, checked on every registered env and every conf/env yaml, and on the env of a package
outside ragen2 (tests/envs/outside, installed for the session: by its entry point and by gymnasium's
registration)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import ragen2_envs
from gymnasium.utils.env_checker import check_env
from helpers import OUTSIDE_IDS
from hydra.utils import instantiate
from omegaconf import OmegaConf

from envs.adapted import ADAPTED
from ragen2.config import CONF_DIR, compose

ENV_CONF = CONF_DIR / "env"
# the adapters of other packages' envs run the checks of their confs in their own files, which skip without
# their package (tests/envs/adapted.py)
CONF_FILES = sorted(p for p in ENV_CONF.glob("*.yaml") if p.stem not in ADAPTED)
# DeepCoder runs every submitted action on each of a problem's 3-4 tests, a sandboxed subprocess (~50 ms) per
# test: 100 fuzzed actions (the 31 near misses, then each kind of garbage 13-14 times) instead of 1,000, which
# took 52 s (250 still took 28 s of the suite)
SLOW_FUZZ_IDS = {"ragen2/DeepCoder-v0"}
FUZZ_COUNT = {"ragen2/DeepCoder-v0": 100}

NEAR_MISSES = [
    "Up.",
    "up!",
    "UP UP",
    "Upp",
    "U p",
    "Lef",
    "Rightt",
    "left right",
    "<answer>Up</answer>",
    "Up || Down",
    "1",
    "2",
    "0",
    "-1",
    "push up",
    "move left",
    "Down\nDown",
    "search[",
    "search[]",
    "click[",
    "finish[]",
    "click[buy now",
    "[]",
    "()",
    "None",
    "null",
    "1 + 1",
    "= 24",
    "```python\n```",
    "\x00",
    "\ud800",
]


def fuzz_actions(rng: np.random.Generator, count: int = 1000) -> list[str]:
    """Garbage of every kind (printable, arbitrary unicode, blank, huge) plus near-miss actions."""
    printable = [chr(c) for c in range(32, 127)]
    out: list[str] = list(NEAR_MISSES)
    while len(out) < count:
        kind = len(out) % 5
        if kind == 0:
            out.append("".join(rng.choice(printable, size=int(rng.integers(0, 40)))))
        elif kind == 1:
            out.append("".join(chr(int(c)) for c in rng.integers(1, 0x10FFFF, size=int(rng.integers(1, 20)))))
        elif kind == 2:
            out.append(" \t\n\r"[len(out) % 4] * int(rng.integers(0, 5)))
        elif kind == 3:
            out.append(str(rng.choice(NEAR_MISSES)) * int(rng.integers(1, 4)))
        else:
            out.append("y" * int(rng.integers(1_000, 100_000)))
    return out


# ragen2's own, the test package's, and any that an installed package declares (its env is checked here too)
ALL_IDS = sorted({*OUTSIDE_IDS, *ragen2_envs.declared_ids()})
FUZZ_IDS = [pytest.param(i, marks=pytest.mark.slow) if i in SLOW_FUZZ_IDS else i for i in ALL_IDS]


@pytest.fixture(autouse=True)
def _outside(outside_envs: tuple[Path, Path]) -> None:
    """The outside package is installed whichever id a test takes."""


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_check_env(env_id: str) -> None:
    check_env(ragen2_envs.make(env_id), skip_render_check=False)


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_reset_is_seeded(env_id: str) -> None:
    first = ragen2_envs.make(env_id).reset(seed=123)[0]
    again = ragen2_envs.make(env_id).reset(seed=123)[0]
    assert first == again
    # the group contract: another sample index of the same seed shows the same instance
    assert ragen2_envs.make(env_id).reset(seed=123, options={"sample": 5})[0] == first
    assert isinstance(ragen2_envs.make(env_id).instructions, str)


@pytest.mark.parametrize("env_id", FUZZ_IDS)
def test_fuzzed_actions_never_raise(env_id: str) -> None:
    env = ragen2_envs.make(env_id)
    env.reset(seed=0)
    for k, text in enumerate(fuzz_actions(np.random.default_rng(0), FUZZ_COUNT.get(env_id, 1000))):
        obs, reward, terminated, truncated, info = env.step(text)
        assert isinstance(obs, str) and obs in env.observation_space
        assert np.isfinite(reward)
        assert isinstance(info["action_is_valid"], bool) and isinstance(info["success"], bool)
        if terminated or truncated:
            env.reset(seed=k)


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_oracle_earns_reward_within_budget(env_id: str) -> None:
    cls = type(ragen2_envs.make(env_id))
    budget = cls.default_max_turns * cls.default_max_actions_per_turn
    earned = []
    for seed in range(50):
        env = ragen2_envs.make(env_id)
        _, info = env.reset(seed=seed)
        if not info.get("solvable", True):  # an instance the env makes unsolvable on purpose (TwoHop's)
            assert env.oracle_action() is None, f"{env_id}: an oracle action for an unsolvable instance"
            continue
        if len(earned) == 5:
            break
        total, success = 0.0, False
        for _ in range(budget):
            action = env.oracle_action()
            assert action is not None, f"{env_id}: no oracle action at seed {seed}"
            _, reward, terminated, truncated, info = env.step(action)
            assert info["action_is_valid"], f"{env_id}: the oracle's own action {action!r} was rejected"
            total += reward
            success = success or info["success"]
            if terminated or truncated:
                break
        earned.append(success or total > 0)
    # stochastic envs (Bandit payouts, slippery ice) may lose an episode; most must pay
    assert sum(earned) >= 3, f"{env_id}: oracle rollouts earned nothing in {earned}"


def test_import_and_make_load_no_heavy_framework() -> None:
    code = (
        "import json, sys, ragen2_envs\n"
        "for env_id in ragen2_envs.own_ids():\n"
        "    ragen2_envs.make(env_id)\n"
        "heavy = ('torch', 'lightning', 'transformers')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_ragen2s_own_envs_are_declared_in_its_entry_points_as_its_source_tree_declares_them() -> None:
    # installed (editable here): the metadata's entry points; from the source folders alone: pyproject.toml
    installed = ragen2_envs.declared_ids("ragen2")
    assert installed == ragen2_envs.registry.source_ids() == ragen2_envs.own_ids()
    assert installed["ragen2/TwoHop-v0"] == "ragen2_envs.twohop.env:TwoHopEnv" and len(installed) == 9
    assert ragen2_envs.registry.source_ids(Path("/nonexistent/pyproject.toml")) == {}


def test_every_registered_env_has_a_config() -> None:
    configured = {OmegaConf.load(path).id for path in CONF_FILES}
    assert set(ragen2_envs.own_ids()) <= configured, set(ragen2_envs.own_ids()) - configured


@pytest.mark.parametrize("path", CONF_FILES, ids=[p.stem for p in CONF_FILES])
def test_env_config_shape_and_make(path: Path) -> None:
    cfg = compose([f"env={path.stem}"]).env
    keys = {"id", "max_turns", "max_actions_per_turn", "step_timeout_s", "kwargs", "tools", "tool_format"}
    assert set(cfg.keys()) == keys, path.name
    assert cfg.id in ragen2_envs.own_ids()
    assert int(cfg.max_turns) >= 1 and int(cfg.max_actions_per_turn) >= 1
    kwargs = OmegaConf.to_container(cfg.kwargs) if cfg.kwargs is not None else {}
    assert isinstance(kwargs, dict)
    env = ragen2_envs.make(cfg.id, **kwargs)
    assert isinstance(env, ragen2_envs.TextEnv)


@pytest.mark.parametrize("path", CONF_FILES, ids=[p.stem for p in CONF_FILES])
def test_turn_limit_is_the_envs_own_capped_by_the_cpu_default(path: Path, tokenizer) -> None:
    # the env's own limit is its class's default_max_turns (Bandit 1, Sokoban 5, WebShop 9, …)
    env_cfg = compose([f"env={path.stem}"]).env
    own = type(ragen2_envs.make(env_cfg.id)).default_max_turns
    assert compose([f"env={path.stem}", "max_turns_cap=null"]).env.max_turns == own
    # the CPU default caps it at 3: single-turn envs stay single-turn, FrozenLake (the main job) runs 3
    assert env_cfg.max_turns == min(own, 3)
    assert compose([f"env={path.stem}", "env.max_turns=7"]).env.max_turns == 7  # an explicit limit wins
    # the rollout runs exactly that many turns
    data = instantiate(compose([f"env={path.stem}", "model=tiny", "rollout=scripted"]).data)
    assert data.env.max_turns == min(own, 3)
    assert data.rollout_cfg.runner(data.env, tokenizer).cfg.max_turns == min(own, 3)


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_every_option_default_is_in_its_declared_bounds(env_id: str) -> None:
    from ragen2.settings import check_type

    declared = ragen2_envs.env_options(env_id)
    assert "render_mode" in declared and "self" not in declared
    for name, option in declared.items():
        check_type(name, option.default, option.hint)
        assert option.problem(option.default) is None, (name, option.default)


@pytest.mark.parametrize("path", CONF_FILES, ids=[p.stem for p in CONF_FILES])
def test_every_conf_env_kwarg_is_a_declared_option_in_bounds(path: Path) -> None:
    node = OmegaConf.load(path)
    declared = ragen2_envs.env_options(node.id)
    for name, value in node.kwargs.items():
        assert name in declared, (path.name, name)
        assert declared[name].problem(value) is None, (path.name, name, value)


def test_an_env_made_directly_is_checked_against_its_bounds_too() -> None:
    from ragen2_envs.frozenlake.env import FrozenLakeEnv

    with pytest.raises(ValueError, match=r"^size=1 must be ≥ 2$"):
        FrozenLakeEnv(1)  # positional, as the signature orders them
    with pytest.raises(ValueError, match=r"^observation='rgb' is not one of grid, coord, grid_coord$"):
        ragen2_envs.make("ragen2/FrozenLake-v0", observation="rgb")
    assert FrozenLakeEnv(5, 0.5).size == 5
