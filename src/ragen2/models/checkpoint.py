"""Reading a ragen2 training checkpoint without a Trainer: the policy's weights and the settings saved with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ragen2.log import log
from ragen2.models.loading import load_model

POLICY_PREFIX = "policy."


def read_checkpoint(checkpoint: str) -> dict[str, Any]:
    """The checkpoint's contents (on the CPU), with an error that says what to pass when it is missing."""
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint={checkpoint!r} does not exist; pass a run's checkpoints/last.ckpt"
        )
    return torch.load(path, map_location="cpu", weights_only=False)


def load_policy(
    name_or_path: str,
    checkpoint: str | None = None,
    dtype: str = "float32",
    state: dict[str, Any] | None = None,
) -> Any:
    """The HF model ``name_or_path``, with the policy weights of a ragen2 ``.ckpt`` loaded on top if given
    (``state``: the checkpoint already read)."""
    model = load_model(name_or_path, dtype)
    if checkpoint is None:
        return model
    weights_all = (state if state is not None else read_checkpoint(checkpoint))["state_dict"]
    weights = {k[len(POLICY_PREFIX) :]: v for k, v in weights_all.items() if k.startswith(POLICY_PREFIX)}
    if not weights:
        raise ValueError(
            f"checkpoint={checkpoint!r} holds no '{POLICY_PREFIX}*' weights: not a ragen2 checkpoint"
        )
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # tied embeddings appear once in the checkpoint; anything else missing means the wrong base model
    missing = [k for k in missing if k not in getattr(model, "_tied_weights_keys", {}) and "lm_head" not in k]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint={checkpoint!r} does not match model.name_or_path={name_or_path!r} "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}); pass the model the run trained"
        )
    return model


def saved_settings(state: dict[str, Any], checkpoint: str) -> dict[str, dict[str, Any]]:
    """The env, rollout and model settings a run saved in its checkpoint (node -> values); empty, with a
    warning, for a checkpoint written before they were saved."""
    data = state.get("RolloutDataModule") or {}
    model = (state.get("ragen2") or {}).get("model")
    saved = {
        **({"env": data["env"], "rollout": data["rollout"]} if data else {}),
        **({"model": model} if model else {}),
    }
    if not saved:
        log.warning(
            "checkpoint=%s holds no run settings (written by an older ragen2): evaluating with the env, model "
            "and rollout settings of the command line; pass the run's own (env=…, env.max_turns=…, …)",
            checkpoint,
        )
    return saved
