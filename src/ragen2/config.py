"""Where the Hydra config tree lives, and composing it from Python (notebooks, tests)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

# ${ragen2.tokens:a,b}: a token count as the floored product (Dr.GRPO's constant = tokens per turn × turns,
# DAPO's overlong buffer = a fraction of the per-turn limit)
OmegaConf.register_new_resolver("ragen2.tokens", lambda *xs: math.floor(math.prod(xs)), replace=True)

CONF_DIR = Path(os.environ.get("RAGEN2_CONF", Path(__file__).resolve().parents[2] / "conf"))


def compose(
    overrides: Sequence[str] = (), config_name: str = "train", run_dir: str | None = None
) -> DictConfig:
    """The config ``ragen2-train`` would run with these overrides (``run_dir`` replaces Hydra's output dir)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import open_dict

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    with open_dict(cfg):
        cfg.run_dir = run_dir or "outputs/notebook"
    return cfg
