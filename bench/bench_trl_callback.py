"""What ``ragen2.integrations.trl.CollapseDiagnostics`` costs a TRL ``GRPOTrainer`` run (CPU, the built-in model).

Two long-lived workers run the same GRPOTrainer (same model, prompts, seed, batch), one with the diagnostics
attached (``every_n_steps``, default 10), one without. Both are started once (imports and model loads are not
timed) and released one optimizer step at a time, alternating which goes first, so the shared machine's noise
hits both. Over ``--steps`` steps (a multiple of ``every_n_steps``: each side then holds the same number of
passes per step) it reports:

- the paired overhead: (Σ step time with − Σ without) / Σ without, the number the goal (≤ 10 %) is about;
- the direct share: Σ pass time (``time/diagnostics``, inside the step) / Σ step time without: the same cost
  read off the clock around the pass alone, free of the other side's noise.

The prompts are tests/integration/test_trl.py's kind (worked examples, then a new word and ``Reply: <think>``),
so the completions carry a reasoning span and the passes score rows. Needs TRL in the running interpreter
(``pip install -e '.[trl]'``). Writes bench/results/trl_callback.json.

  python bench/bench_trl_callback.py [--prompts 4] [--group-size 4] [--tokens 16] [--steps 10] [--every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import provenance
from workers import Worker

MARK = "STEP "  # worker lines that carry a result; everything else is the worker's own logging
WORDS = ("cloud", "stone", "tiger", "lemon", "piano", "candle", "forest", "rocket")
SHOTS = (
    "Repeat the word inside the think tags, then answer it.\n"
    "Word: apple\nReply: <think>the word is apple</think> apple\n"
    "Word: river\nReply: <think>the word is river</think> river\n"
)


def echo_reward(completions: list[str], word: list[str], **_: Any) -> list[float]:
    return [
        1.0 if c.partition("</think>")[2].strip().startswith(w) else 0.0 for c, w in zip(completions, word)
    ]


def worker(args: argparse.Namespace) -> None:
    """One side: a GRPOTrainer whose steps each wait for a "go" line and report their time."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ragen2.integrations.trl import CollapseDiagnostics
    from ragen2.models import load_tokenizer
    from ragen2.models.loading import resolve_model_path

    class Gate(TrainerCallback):
        start = 0.0

        def on_step_begin(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
            if sys.stdin.readline().strip() != "go":
                raise SystemExit(0)
            self.start = time.perf_counter()

        def on_step_end(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
            seconds = time.perf_counter() - self.start
            metrics = trainer._metrics["train"]  # before the log line averages and clears them
            row = {"step_s": seconds, "pass_s": sum(metrics.get("time/diagnostics", []))}
            row["rows"] = sum(metrics.get("diag/first_turn/rows", []))
            row["tokens_processed"] = sum(metrics.get("diag/tokens_processed", []))
            row["completion_tokens"] = metrics["completions/mean_length"][-1] * args.prompts * args.group_size
            print(MARK + json.dumps(row), flush=True)

    words = WORDS[: args.prompts]
    prompts = [{"prompt": f"{SHOTS}Word: {w}\nReply: <think>", "word": w} for w in words]
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.prompts * args.group_size,
            num_generations=args.group_size,
            max_completion_length=args.tokens,
            max_steps=args.steps,
            learning_rate=1e-6,
            temperature=1.0,
            beta=0.0,
            shuffle_dataset=False,
            use_cpu=True,
            bf16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=resolve_model_path("builtin"),
            reward_funcs=echo_reward,
            args=config,
            train_dataset=Dataset.from_list(prompts * args.steps),
            processing_class=load_tokenizer("builtin"),
            callbacks=[Gate()],
        )
        if args.worker == "with":
            CollapseDiagnostics(every_n_steps=args.every).attach(trainer)
        trainer.train()


def summarise(rows: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    n = min(len(r) for r in rows.values())
    with_s = sum(r["step_s"] for r in rows["with"][:n])
    without_s = sum(r["step_s"] for r in rows["without"][:n])
    pass_s = sum(r["pass_s"] for r in rows["with"][:n])
    passes = sum(1 for r in rows["with"][:n] if r["pass_s"] > 0)
    return {
        "steps": n,
        "passes": passes,
        "step_s_median": {k: statistics.median(r["step_s"] for r in v[:n]) for k, v in rows.items()},
        "step_s_total": {"with": with_s, "without": without_s},
        "pass_s_total": pass_s,
        "rows_scored": sum(r["rows"] for r in rows["with"][:n]),
        "paired_overhead": (with_s - without_s) / without_s,
        "direct_share": pass_s / without_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=4, help="distinct prompts per step (≤ 8)")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt")
    parser.add_argument("--tokens", type=int, default=16, help="max new tokens per completion")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per side, interleaved")
    parser.add_argument("--every", type=int, default=10, help="CollapseDiagnostics(every_n_steps=...)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "trl_callback.json")
    parser.add_argument("--worker", choices=["with", "without"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.steps % args.every:
        raise SystemExit(
            f"--steps={args.steps} must be a multiple of --every={args.every}: equal passes per step"
        )

    record = provenance()  # before the workers start: the load average the run began under
    work = Path(tempfile.mkdtemp(prefix="trl_callback-"))
    common = [
        __file__,
        *(
            f"--{k.replace('_', '-')}={getattr(args, k)}"
            for k in ("prompts", "group_size", "tokens", "steps", "every")
        ),
    ]
    workers = {
        name: Worker(name, [sys.executable, *common, f"--worker={name}"], work / f"{name}.log", MARK)
        for name in ("with", "without")
    }
    rows: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
    start = time.perf_counter()
    try:
        for s in range(args.steps):
            for name in ("with", "without") if s % 2 == 0 else ("without", "with"):
                rows[name].append(workers[name].step())
                r = rows[name][-1]
                print(
                    f"step {s} {name:<8} {r['step_s']:7.1f}s  pass {r['pass_s']:6.1f}s  rows {r['rows']:3.0f}",
                    flush=True,
                )
    finally:
        for w in workers.values():
            w.close()
    summary = summarise(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    setup = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if v is not None}
    args.out.write_text(
        json.dumps(
            {
                "provenance": record,
                "setup": setup
                | {"model": "builtin (SmolLM2-135M fp32)", "prompt": "worked examples, then <think>"},
                "summary": summary,
                "within_goal": summary["paired_overhead"] <= 0.10 and summary["direct_share"] <= 0.10,
                "steps": rows,
                "run_seconds": time.perf_counter() - start,
                "load_average_1min_at_end": os.getloadavg()[0],
            },
            indent=2,
        )
        + "\n"
    )
    med = summary["step_s_median"]
    print(f"\n{'':<10}{'median step s':>15}{'total s':>10}")
    for name in ("without", "with"):
        print(f"{name:<10}{med[name]:>15.1f}{summary['step_s_total'][name]:>10.1f}")
    print(
        f"passes {summary['passes']} (every {args.every} steps), {summary['rows_scored']:.0f} rows scored, "
        f"{summary['pass_s_total']:.1f} s in passes"
    )
    print(
        f"overhead, paired steps: {summary['paired_overhead']:+.1%}; pass time / step time: {summary['direct_share']:.1%} (goal ≤ 10 %)"
    )
    print(f"wrote {args.out}; worker logs in {work}")


if __name__ == "__main__":
    main()
