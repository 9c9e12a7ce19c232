"""Reading a ragen2 training checkpoint without a Trainer: the policy's weights and the settings saved with it.

Every read is weights-only (``torch.load(weights_only=True)``): a checkpoint is a pickle, and a full unpickle
runs whatever code the file names, so a shared or downloaded ``.ckpt`` could run code. ragen2's checkpoints
hold only tensors, numbers, strings and containers of them (``ragen2.modules.run_state``), which the
weights-only unpickler reads without any allow-list. A file that is not such a checkpoint (empty, truncated,
another format, or one naming other objects) is a ``CheckpointError``: one line naming the file and the fix.
So is one whose weights hold NaN or ±inf (``NonFiniteCheckpointError``): it is refused where it is read, by
every program that loads one (training's resume, ``ragen2-eval``, ``-export``, ``-diagnose``), rather than
failing mid-iteration or being evaluated and exported as it is.
Remote paths (``s3://…``, ``https://…``) are refused: a checkpoint is read from a local file, verified first.

A run with LoRA adapters (``model.lora``) saves only what it trains: the adapters (and their optimizer
state), with its ``model.*`` settings. ``load_policy`` puts them back onto the base model those name and, by
default, merges them into its weights: a plain HF model, as eval, diagnose, export and vLLM load one.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ragen2.errors import ConfigError
from ragen2.log import log
from ragen2.models.loading import load_model
from ragen2.models.lora import LoRAConfig
from ragen2.settings import settings

POLICY_PREFIX = "policy."
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save has written zip archives since torch 1.6


class CheckpointError(ConfigError):
    """A checkpoint file that cannot be used, named with the key that gave it, the file and the fix."""


class MissingCheckpointError(CheckpointError, FileNotFoundError):
    """The checkpoint file does not exist."""


class NonFiniteCheckpointError(CheckpointError):
    """The checkpoint's weights hold NaN or ±inf."""


def nonfinite_weights(state_dict: dict[str, Any]) -> list[str]:
    """The keys of the floating-point tensors in ``state_dict`` that hold NaN or ±inf, in order."""
    return [
        key
        for key, value in state_dict.items()
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all()
    ]


def _first_line(err: BaseException, marker: str = "") -> str:
    """The line of ``err``'s message holding ``marker`` (its first line without one), as one short line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    chosen = next((line for line in lines if marker and marker in line), lines[0] if lines else "")
    return chosen.split(". ")[0].rstrip(".") or type(err).__name__


def read_checkpoint(
    checkpoint: str | Path,
    key: str = "checkpoint",
    map_location: str | Callable[..., Any] | None = "cpu",
    mmap: bool = True,
    finite: bool = True,
) -> dict[str, Any]:
    """The contents of a ragen2 (Lightning) checkpoint, loaded weights-only, its weights checked finite.

    ``key`` names the setting the path came from, for the error message. ``mmap`` maps the tensors rather
    than reading them: a multi-GB file opens in milliseconds and pages in only what is used. ``finite``
    reads every weight once (about 0.2 s per 500 MB once the file is cached, what loading it costs anyway);
    only a probe that uses no weight (whether a file is whole) turns it off."""
    path = Path(checkpoint)
    where = f"{key}: {checkpoint}" if "=" in key else f"{key}={checkpoint}"  # key may carry its value
    if "://" in str(checkpoint):
        raise CheckpointError(
            f"{where}: remote checkpoints are not read (a checkpoint is verified and loaded weights-only from "
            "a local file). Fix: copy it to local disk first and pass that path"
        )
    if path.is_dir():
        inside = sorted(
            str(p) for p in (*path.glob("*.ckpt"), *path.glob("checkpoints/*.ckpt")) if p.is_file()
        )
        listed = ", ".join(inside[:4]) + (f" and {len(inside) - 4} more" if len(inside) > 4 else "")
        raise CheckpointError(
            f"{where} is a folder, not a checkpoint file. Fix: "
            + (
                f"pass one of the checkpoints in it: {listed}"
                if inside
                else "pass a run's checkpoints/last.ckpt"
            )
        )
    if not path.is_file():
        raise MissingCheckpointError(f"{where} does not exist. Fix: pass a run's checkpoints/last.ckpt")
    size = path.stat().st_size
    intact = "Fix: pass an intact checkpoint (checkpoints/last.1.ckpt holds the save before last.ckpt)"
    if size == 0:
        raise CheckpointError(f"{where} is empty (0 bytes): a save that never finished. {intact}")
    with path.open("rb") as f:
        if f.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
            raise CheckpointError(f"{where} is not a torch.save checkpoint (no zip archive header). {intact}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:  # the weights-only unpickler refused a global: code, not data
        raise CheckpointError(
            f"{where} names objects other than tensors and plain values ({_first_line(err, 'GLOBAL')}), "
            "and loading it would run code; it was not loaded. Fix: use a checkpoint written by ragen2-train, "
            "from a source you trust"
        ) from None
    except Exception as err:  # truncated or corrupt archives fail inside torch with many exception types
        raise CheckpointError(f"{where} is truncated or corrupt ({_first_line(err)}). {intact}") from None
    if not isinstance(state, dict) or not isinstance(state.get("state_dict"), dict):
        raise CheckpointError(
            f"{where} holds no state_dict: not a Lightning checkpoint. Fix: pass a run's checkpoints/last.ckpt"
        )
    bad = nonfinite_weights(state["state_dict"]) if finite else []
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise NonFiniteCheckpointError(
            f"{where} holds NaN or inf weights ({', '.join(bad[:3])}{more}): nothing can be trained, evaluated "
            "or exported from them. Fix: pass a checkpoint with finite weights (checkpoints/last.1.ckpt holds "
            "the save before last.ckpt)"
        )
    return state


def saved_lora(state: dict[str, Any]) -> LoRAConfig | None:
    """The ``model.lora`` settings a run saved in its checkpoint: None for a run that trained the whole model."""
    lora = ((state.get("ragen2") or {}).get("model") or {}).get("lora")
    return None if lora is None else settings(LoRAConfig, lora, "model.lora")


def load_policy(
    name_or_path: str,
    checkpoint: str | None = None,
    dtype: str = "float32",
    state: dict[str, Any] | None = None,
    merge: bool = True,
) -> Any:
    """The HF model ``name_or_path``, with the policy weights of a ragen2 ``.ckpt`` loaded on top if given
    (``state``: the checkpoint already read). A LoRA run's adapters are merged into the weights, or with
    ``merge=False`` returned as PEFT's ``PeftModel`` over the base model (its ``save_pretrained`` writes them)."""
    if checkpoint is None:
        return load_model(name_or_path, dtype)
    state = state if state is not None else read_checkpoint(checkpoint)
    weights_all = state["state_dict"]
    weights = {k[len(POLICY_PREFIX) :]: v for k, v in weights_all.items() if k.startswith(POLICY_PREFIX)}
    if not weights:
        raise CheckpointError(
            f"checkpoint={checkpoint} holds no '{POLICY_PREFIX}*' weights: not a ragen2 checkpoint. Fix: pass a "
            "checkpoint written by ragen2-train"
        )
    lora = saved_lora(state)
    base = load_model(name_or_path, dtype)
    adapted = None if lora is None else lora.wrap(base, f"model.name_or_path={name_or_path!r}")
    model = base if adapted is None else adapted.get_base_model()
    own = model.state_dict()
    differ = [
        f"{POLICY_PREFIX}{k}: {list(v.shape)} there, {list(own[k].shape)} here"
        for k, v in weights.items()
        if k in own and tuple(v.shape) != tuple(own[k].shape)
    ]
    if differ:
        saved = (state.get("ragen2") or {}).get("model") or {}
        raise another_model(f"checkpoint={checkpoint}", name_or_path, differ, saved)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # tied embeddings appear once in the checkpoint and a LoRA run's frozen base not at all (the base model
    # supplies both); anything else missing means the wrong base model
    frozen = {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    tied = getattr(model, "_tied_weights_keys", {})
    missing = [k for k in missing if k not in frozen and k not in tied and "lm_head" not in k]
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint={checkpoint} does not match model.name_or_path={name_or_path} "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}). Fix: pass the model the run trained"
        )
    if adapted is None:
        return model
    return adapted.merge_and_unload() if merge else adapted


def another_model(
    where: str, name_or_path: str, problems: list[str], saved_model: Mapping[str, Any], more: str = ""
) -> CheckpointError:
    """The error for a checkpoint whose policy weights are another model's than ``name_or_path``'s
    (``problems``: the tensors that differ, in words; ``saved_model``: the checkpoint's own model settings)."""
    model_then = saved_model.get("name_or_path")
    fix = f"model.name_or_path={model_then} (the checkpoint's)" if model_then else "the checkpoint's model"
    return CheckpointError(
        f"{where} holds the weights of another model than model.name_or_path={name_or_path} "
        f"({len(problems)} tensors differ, e.g. {problems[0]}). Fix: {fix}{more}"
    )


def saved_settings(state: dict[str, Any], checkpoint: str) -> dict[str, dict[str, Any]]:
    """The env, rollout and model settings a run saved in its checkpoint (node -> values); empty, with a
    warning, for a checkpoint written before they were saved."""
    data = state.get("RolloutDataModule") or {}
    model = (state.get("ragen2") or {}).get("model")
    saved = {
        **({"env": isolated_env(data["env"], checkpoint), "rollout": data["rollout"]} if data else {}),
        **({"model": model} if model else {}),
    }
    if not saved:
        log.warning(
            "checkpoint=%s holds no run settings (written by an older ragen2): evaluating with the env, model "
            "and rollout settings of the command line; pass the run's own (env=…, env.max_turns=…, …)",
            checkpoint,
        )
    return saved


#: env.kwargs that lower the sandbox's isolation: they come from the command line or the user's own config,
#: never from a file being loaded (a shared checkpoint must not turn off the sandbox of whoever evaluates it)
ISOLATION_KWARGS = ("allow_unisolated",)


def isolated_env(env: dict[str, Any], checkpoint: str) -> dict[str, Any]:
    """``env`` (a checkpoint's saved env settings) with each of ``ISOLATION_KWARGS`` reset to false, with a
    warning for each it held true."""
    kwargs = dict(env.get("kwargs") or {})
    for name in (n for n in ISOLATION_KWARGS if kwargs.get(n)):
        log.warning(
            "checkpoint=%s saved env.kwargs.%s=true: ignored, it is false here (settings that lower the "
            "sandbox's isolation are never taken from a loaded file). Fix: pass ++env.kwargs.%s=true on the "
            "command line to run its code that way",
            checkpoint,
            name,
            name,
        )
        kwargs[name] = False
    return {**env, "kwargs": kwargs}
