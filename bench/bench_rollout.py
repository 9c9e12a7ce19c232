"""Rollout backends side by side: HF sampler vs vLLM (colocated engine) on the main job's workload and at 8 × 16.

For each workload (FrozenLake, 3 turns, 48 tokens per turn, the built-in model) both samplers collect the
same episodes (same instance seeds, same sampler seed) in one run: seconds, episodes/s and sampled
tokens/s, and their ratio. Then the agent loop's overhead over vLLM itself: overhead = collect seconds /
seconds inside the engine's own ``LLM.generate`` calls during that collect − 1 (everything else is the
loop: rendering, parsing, env steps, making samples). As a check that those calls are the engine's whole
work, the very per-turn prompt batches the runner sent are replayed as raw ``LLM.generate`` calls (same
``SamplingParams``, seeds and waves, prefix cache reset first, as after a weight sync): replay seconds
vs in-loop engine seconds is the run-to-run noise of the engine on these 2 shared cores.
Engine start-up and the first weight sync are timed separately (once per run, not per iteration).
Writes bench/results/rollout.json.

  python bench/bench_rollout.py [--model builtin] [--workloads 4x4,8x16] [--kv-cache-gb 4]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from provenance import provenance

from ragen2._env import set_defaults

set_defaults()

from ragen2.config import build, compose  # noqa: E402
from ragen2.models.loading import load_model, load_tokenizer  # noqa: E402
from ragen2.rollout.hf import HFSampler  # noqa: E402
from ragen2.rollout.vllm import VLLMSampler, vllm_sampler  # noqa: E402


class Recorder:
    """Wraps a VLLMSampler: records each generate call's prompts, params and seed, and its seconds."""

    def __init__(self, sampler: VLLMSampler) -> None:
        self.sampler = sampler
        self.needs_oracle = False
        self.records_entropy = False
        self.calls: list[tuple[list[list[int]], object, int]] = []

    def generate(self, prompts, params, seed, meta=None):  # type: ignore[no-untyped-def]
        self.calls.append(([list(p) for p in prompts], params, seed))
        return self.sampler.generate(prompts, params, seed, meta)


def replay(sampler: VLLMSampler, calls: list) -> float:
    """Seconds of the engine alone over the recorded calls (the prefix cache reset first): the same seeded
    requests in the same waves, without the agent loop around them or the samples made of the outputs."""
    sampler.engine().reset_prefix_cache()
    before = sampler.engine_seconds  # the span the in-loop engine time covers: the generate calls
    for prompts, params, seed in calls:
        sampler.submit(prompts, params, seed)
    return sampler.engine_seconds - before


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--workloads", default="4x4,8x16", help="groups x group_size, comma-separated")
    parser.add_argument("--kv-cache-gb", type=float, default=4.0)
    parser.add_argument("--skip-hf-above", type=int, default=10_000, help="episodes; HF is skipped above")
    args = parser.parse_args()
    record = provenance()
    tokenizer, model = load_tokenizer(args.model), load_model(args.model).eval()

    start = time.perf_counter()
    vllm = vllm_sampler(model=args.model, kv_cache_gb=args.kv_cache_gb, max_model_len=4096)(tokenizer)
    vllm.engine()
    engine_s = time.perf_counter() - start
    start = time.perf_counter()
    vllm.sync_weights(model)
    sync_s = time.perf_counter() - start
    hf = HFSampler(tokenizer, model)

    results: dict[str, dict] = {}
    for workload in args.workloads.split(","):
        groups, size = (int(x) for x in workload.split("x"))
        data = build(
            compose([f"model={args.model}", f"rollout.groups={groups}", f"rollout.group_size={size}"]).data
        )
        runner = data.rollout_cfg.runner(data.env, tokenizer)
        seeds = list(range(groups))
        row: dict[str, dict] = {}
        backends = [("vllm", Recorder(vllm))]
        if groups * size <= args.skip_hf_above:
            backends.insert(0, ("hf", hf))
        for name, sampler in backends:
            if name == "vllm":
                vllm.llm.reset_prefix_cache()  # as after the iteration's weight sync
            cached0, prompt0, engine0 = vllm.cached_tokens, vllm.prompt_tokens, vllm.engine_seconds
            start = time.perf_counter()
            episodes = runner.collect(sampler, seeds, size, sample_seed=0)
            seconds = time.perf_counter() - start
            tokens = sum(len(t.sampled_ids) for ep in episodes for t in ep.turns)
            row[name] = {
                "seconds": seconds,
                "episodes_per_s": len(episodes) / seconds,
                "tokens_per_s": tokens / seconds,
                "sampled_tokens": tokens,
                "turns": sum(len(ep.turns) for ep in episodes),
                "success": sum(ep.success for ep in episodes) / len(episodes),
            }
            if name == "vllm":
                engine = vllm.engine_seconds - engine0
                row[name]["engine_seconds"] = engine
                row[name]["loop_overhead"] = seconds / engine - 1
                row[name]["replay_seconds"] = replay(vllm, sampler.calls)
                row[name]["replay_over_engine"] = row[name]["replay_seconds"] / engine
                row[name]["prefix_cache_hit_rate"] = (vllm.cached_tokens - cached0) / max(
                    1, vllm.prompt_tokens - prompt0
                )
        if "hf" in row:
            row["vllm_speedup"] = row["hf"]["seconds"] / row["vllm"]["seconds"]
        results[workload] = row

    print(f"engine start {engine_s:.1f} s, first weight sync {sync_s:.2f} s")
    head = f"{'workload':<9} {'backend':<6} {'seconds':>8} {'episodes/s':>11} {'tokens/s':>9} {'turns':>6}"
    print(head + f" {'loop overhead':>14} {'replay/engine':>14} {'cache hits':>11} {'speed-up':>9}")
    for workload, row in results.items():
        for name in ("hf", "vllm"):
            if name not in row:
                continue
            r = row[name]
            extra = (
                f" {r['loop_overhead']:>13.1%} {r['replay_over_engine']:>13.2f}x {r['prefix_cache_hit_rate']:>10.1%}"
                if name == "vllm"
                else f" {'':>14} {'':>14} {'':>11}"
            )
            speed = f" {row['vllm_speedup']:>8.2f}x" if name == "vllm" and "vllm_speedup" in row else ""
            print(
                f"{workload:<9} {name:<6} {r['seconds']:>8.1f} {r['episodes_per_s']:>11.2f} "
                f"{r['tokens_per_s']:>9.1f} {r['turns']:>6}{extra}{speed}"
            )
    out = Path(__file__).parent / "results" / "rollout.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "provenance": record,
        "args": vars(args),
        "engine_start_s": engine_s,
        "first_sync_s": sync_s,
        "results": results,
    }
    out.write_text(json.dumps(payload, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
