"""Every config in conf/ composes, and its objects instantiate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from ragen2.config import CONF_DIR, compose

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("hydra",))


def _options(group: str) -> list[str]:
    # files starting with "_" are shared bases (conf/algo/_common.yaml), not choices
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.stem.startswith("_"))


# Nested groups are appended to a parent choice: ragen2-train algo=ppo +algo/critic=separate
NESTED = {"algo/critic": "algo=ppo", "algo/kl_reward": "algo=grpo"}
CASES = [(g, o, f"{g}={o}") for g in GROUPS for o in _options(g) if g not in ("sweep",)]
CASES += [(g, o, f"+{g}={o}") for g in NESTED for o in _options(g)]


@pytest.mark.parametrize(("group", "option", "override"), CASES, ids=[c[2] for c in CASES])
def test_group_option_composes_and_instantiates(
    group: str, option: str, override: str, tmp_path: Path
) -> None:
    cfg = compose(
        [*([NESTED[group]] if group in NESTED else []), override, "model=tiny"], run_dir=str(tmp_path)
    )
    data = instantiate(cfg.data)
    module = instantiate(cfg.module)
    assert data.env.id == cfg.env.id
    assert module.mini_batch_size == cfg.algo.mini_batch_size
    for node in ("callbacks", "logger"):
        for c in (cfg.get(node) or {}).values():
            if c is not None:
                instantiate(c)
    if cfg.trainer.accelerator != "gpu" or torch.cuda.is_available():
        instantiate(cfg.trainer)


def test_eval_config_composes() -> None:
    cfg = compose(["env=frozenlake"], config_name="eval")
    assert cfg.env.id == "ragen2/FrozenLake-v0" and cfg.num_seeds > 0


def test_bad_override_names_the_key(tmp_path: Path) -> None:
    cfg = compose(["model=tiny", "rollout.group_size=1"], run_dir=str(tmp_path))
    with pytest.raises(Exception, match="group_size"):
        instantiate(cfg.data)
