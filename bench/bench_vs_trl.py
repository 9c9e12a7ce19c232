"""The race with the peer: ragen2's iteration against TRL's ``GRPOTrainer`` step, side by side on CPU.

Same model (``--model``, default the built-in SmolLM2-135M fp32 folder), same prompts (the first-turn
prompts ragen2's Bandit env renders, ``env=bandit env.max_turns=1``, passed to TRL as raw text and
checked to tokenize to the same ids), same group size, same max new tokens, one optimizer step per
iteration, temperature 1.0, no KL, no filter. TRL 1.16 runs in its own virtualenv (created here when
missing: ``--trl-venv``); both sides are long-lived worker processes, started once (model loads and
imports are not timed) and released one iteration at a time, alternating which goes first, so the
shared machine's noise hits both. Reported per side: iteration, rollout (ragen2: ``time/rollout``;
TRL: ``_generate_and_score_completions``), update (ragen2: ``time/update``; TRL: the rest of the step)
and completion tokens; then ragen2 ÷ TRL (medians, and the median of the paired per-repeat ratios).
Writes bench/results/vs_trl.json.

  python bench/bench_vs_trl.py [--model builtin] [--groups 4] [--group-size 4] [--tokens 64]
                               [--repeats 3] [--trl-venv /work/venv-trl]

Differences that remain: ragen2 stops a completion at ``</answer>`` (its action format), TRL only at
EOS, so the completion-token columns are printed too; TRL's reward is a format check (the env does not
exist in its virtualenv), which does not change its compute.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import provenance
from workers import Worker

TRL_PINS = (["torch==2.13.0"], ["trl==1.16.0", "datasets", "transformers<5.20"])
RACE = "RACE "  # worker lines that carry a result; everything else is the worker's own logging


def _report(payload: dict[str, Any]) -> None:
    print(RACE + json.dumps(payload), flush=True)


def _wait_for_go() -> None:
    if sys.stdin.readline().strip() != "go":
        raise SystemExit(0)  # the driver closed the pipe: stop


# ---- ragen2 worker (runs in ragen2's environment) ----------------------------------------------------
def ragen2_overrides(args: argparse.Namespace) -> list[str]:
    return [
        f"model.name_or_path={args.model}",
        "env=bandit",
        "env.max_turns=1",
        f"rollout.max_new_tokens={args.tokens}",
        f"rollout.groups={args.groups}",
        f"rollout.group_size={args.group_size}",
        f"algo.mini_batch_size={args.groups * args.group_size}",  # one optimizer step per iteration
        "filter=none",
        "diagnostics=off",
        "trainer.limit_val_batches=0",
        "callbacks.curves=null",
        "callbacks.rollout_table=null",
        "callbacks.checkpoint=null",  # TRL saves nothing either (save_strategy="no")
        f"iterations={args.repeats}",
        f"algo.share_prompt_prefix={str(args.share_prompt_prefix).lower()}",
    ]


class Gate:
    """Lightning callback: each iteration starts on a "go" line and reports its times when it ends."""

    def __init__(self) -> None:
        self.start = 0.0

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        _wait_for_go()
        self.start = time.perf_counter()

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        seconds = time.perf_counter() - self.start
        m = module.last_metrics
        episodes = trainer.datamodule.rollout_cfg.groups * trainer.datamodule.rollout_cfg.group_size
        _report(
            {
                "iteration_s": seconds,
                "rollout_s": m["time/rollout"],
                "update_s": m["time/update"],
                "completion_tokens": m["rollout/response_length"] * episodes,
                "optimizer_steps": m["train/optimizer_steps"],
            }
        )
        if trainer.current_epoch + 1 < trainer.max_epochs:
            _wait_for_go()
            self.start = time.perf_counter()


def _gate_callback() -> Any:
    import lightning as L

    return type("RaceGate", (Gate, L.Callback), {})()


def ragen2_worker(args: argparse.Namespace) -> None:
    from ragen2._env import set_defaults

    set_defaults()
    from ragen2.config import compose
    from ragen2.train import run

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = compose(ragen2_overrides(args), run_dir=run_dir)
        from omegaconf import open_dict

        with open_dict(cfg):
            cfg.callbacks["race_gate"] = {"_target_": "bench_vs_trl._gate_callback"}
        run(cfg)


def rendered_prompts(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every iteration's first-turn prompts, exactly as ragen2's DataModule renders them (one per group)."""
    from ragen2._env import set_defaults

    set_defaults()
    from ragen2.config import build, compose
    from ragen2.data.seeds import instance_seeds, sampler_seed
    from ragen2.rollout.base import Sample

    class Recorder:
        needs_oracle = False
        records_entropy = True

        def __init__(self, eos: int) -> None:
            self.eos, self.prompts = eos, []

        def generate(self, prompts, params, seed, meta=None):
            self.prompts += [list(p) for p in prompts]
            return [Sample([self.eos], "eos", [0.0], [0.0]) for _ in prompts]

        def sync_weights(self, model: Any) -> None:
            pass

    with tempfile.TemporaryDirectory() as run_dir:
        data = build(compose(ragen2_overrides(args), run_dir=run_dir).data)
    data.setup()
    out = []
    for it in range(args.repeats):
        rec = Recorder(data.tokenizer.eos_token_id)
        seeds = instance_seeds(data.seed, it, data.rollout_cfg.groups)
        data.runner.collect(rec, seeds, args.group_size, sample_seed=sampler_seed(data.seed, it))
        groups = [rec.prompts[g * args.group_size : (g + 1) * args.group_size] for g in range(args.groups)]
        if any(p != g[0] for g in groups for p in g):
            raise SystemExit("a group's rollouts see different prompts: TRL's groups share one")
        out += [{"ids": g[0], "text": data.tokenizer.decode(g[0], skip_special_tokens=False)} for g in groups]
    return out


# ---- TRL worker (runs in TRL's own virtualenv; imports nothing from ragen2) --------------------------
def trl_worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    prompts = json.loads(Path(args.prompts).read_text())
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    for p in prompts:  # the same ids reach the model on both sides
        ids = tokenizer(p["text"], add_special_tokens=False)["input_ids"]
        if ids != p["ids"]:
            raise SystemExit(
                f"TRL's tokenizer re-tokenizes a prompt differently ({len(ids)} vs {len(p['ids'])})"
            )

    def format_reward(completions: list[str], **_: Any) -> list[float]:
        return [1.0 if "</answer>" in c else -0.1 for c in completions]

    class StepGate(TrainerCallback):
        def __init__(self) -> None:
            self.start, self.rollout = 0.0, 0.0

        def on_step_begin(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
            _wait_for_go()
            self.start, self.rollout = time.perf_counter(), 0.0

        def on_step_end(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
            seconds = time.perf_counter() - self.start
            lengths = trainer._metrics["train"]["completions/mean_length"]
            _report(
                {
                    "iteration_s": seconds,
                    "rollout_s": self.rollout,
                    "update_s": seconds - self.rollout,
                    "completion_tokens": lengths[-1] * args.groups * args.group_size,
                    "optimizer_steps": 1.0,
                }
            )

    gate = StepGate()
    with tempfile.TemporaryDirectory() as out_dir:
        config = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=args.groups * args.group_size,  # completions per step
            gradient_accumulation_steps=1,
            num_generations=args.group_size,
            max_completion_length=args.tokens,
            max_steps=args.repeats,
            learning_rate=1e-6,
            temperature=1.0,
            beta=0.0,
            shuffle_dataset=False,  # step r trains on ragen2's iteration-r prompts
            use_cpu=True,
            bf16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=args.model_path,
            reward_funcs=format_reward,
            args=config,
            train_dataset=Dataset.from_list([{"prompt": p["text"]} for p in prompts]),
            processing_class=tokenizer,
            callbacks=[gate],
        )
        generate = trainer._generate_and_score_completions

        def timed_generate(*a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            out = generate(*a, **kw)
            gate.rollout += time.perf_counter() - start
            return out

        trainer._generate_and_score_completions = timed_generate
        trainer.train()


# ---- driver ------------------------------------------------------------------------------------------
def ensure_trl_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import trl, datasets; assert trl.__version__ == '1.16.0'"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"creating TRL's virtualenv at {venv} (torch 2.13.0, trl 1.16.0; a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for pins in TRL_PINS:  # torch first: the local CPU wheel, not a CUDA build
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    subprocess.run(probe, check=True)
    return python


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


KEYS = ("iteration_s", "rollout_s", "update_s", "completion_tokens")


def summarise(rows: dict[str, list[dict[str, float]]]) -> tuple[dict, dict, float]:
    """Per-side medians, their ragen2 ÷ TRL ratios, and the median of the paired per-repeat ratios."""
    n = min(len(rs) for rs in rows.values())
    summary = {name: {k: _median(rs[:n], k) for k in KEYS} for name, rs in rows.items()}
    ratios = {k: summary["ragen2"][k] / summary["trl"][k] for k in KEYS}
    paired = statistics.median(
        a["iteration_s"] / b["iteration_s"] for a, b in zip(rows["ragen2"], rows["trl"])
    )
    return summary, ratios, paired


def write_results(
    args: argparse.Namespace,
    record: dict[str, Any],
    prompts: list[dict[str, Any]],
    rows: dict[str, list[dict[str, float]]],
    complete: bool,
) -> None:
    summary, ratios, paired = summarise(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "provenance": record,
                "args": {
                    k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if v is not None
                },
                "complete": complete,  # false: the race was stopped early; these are the repeats it finished
                "prompt_tokens": [len(p["ids"]) for p in prompts],
                "repeats": rows,
                "median": summary,
                "ratio_ragen2_to_trl": ratios,
                "paired_iteration_ratio_median": paired,
                "load_average_1min_at_end": os.getloadavg()[0],
            },
            indent=2,
        )
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64, help="max new tokens per completion")
    parser.add_argument("--repeats", type=int, default=3, help="iterations per side, interleaved")
    parser.add_argument("--trl-venv", type=Path, default=Path("/work/venv-trl"))
    parser.add_argument(
        "--share-prompt-prefix",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ragen2 runs each group's prompt once in the update (algo.share_prompt_prefix)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "vs_trl.json")
    parser.add_argument("--worker", choices=["ragen2", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--prompts", help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "ragen2":
        return ragen2_worker(args)
    if args.worker == "trl":
        return trl_worker(args)

    from ragen2.models.loading import resolve_model_path

    record = provenance()  # before the workers start: the load average the race began under
    trl_python = ensure_trl_venv(args.trl_venv)
    prompts = rendered_prompts(args)
    work = Path(tempfile.mkdtemp(prefix="vs_trl-"))
    (work / "prompts.json").write_text(json.dumps(prompts))
    common = [
        __file__,
        f"--model={args.model}",
        f"--groups={args.groups}",
        f"--group-size={args.group_size}",
        f"--tokens={args.tokens}",
        f"--repeats={args.repeats}",
    ]
    workers = {
        "ragen2": Worker(
            "ragen2",
            [
                sys.executable,
                *common,
                "--worker=ragen2",
                "--share-prompt-prefix" if args.share_prompt_prefix else "--no-share-prompt-prefix",
            ],
            work / "ragen2.log",
            RACE,
        ),
        "trl": Worker(
            "trl",
            [
                str(trl_python),
                *common,
                "--worker=trl",
                f"--prompts={work / 'prompts.json'}",
                f"--model-path={resolve_model_path(args.model)}",
            ],
            work / "trl.log",
            RACE,
        ),
    }
    rows: dict[str, list[dict[str, float]]] = {"ragen2": [], "trl": []}
    try:
        for r in range(args.repeats):
            for name in ("ragen2", "trl") if r % 2 == 0 else ("trl", "ragen2"):  # alternate who goes first
                rows[name].append(workers[name].step())
                row = rows[name][-1]
                print(
                    f"repeat {r} {name:<7} iteration {row['iteration_s']:7.1f}s  rollout {row['rollout_s']:7.1f}s"
                    f"  update {row['update_s']:7.1f}s  tokens {row['completion_tokens']:5.0f}",
                    flush=True,
                )
            write_results(
                args, record, prompts, rows, complete=r + 1 == args.repeats
            )  # a long race keeps what it has
    finally:
        for w in workers.values():
            w.close()
    summary, ratios, paired = summarise(rows)
    print(f"\n{'':<8}{'iteration s':>13}{'rollout s':>11}{'update s':>10}{'completion tokens':>19}")
    for name, s in summary.items():
        print(
            f"{name:<8}{s['iteration_s']:>13.1f}{s['rollout_s']:>11.1f}{s['update_s']:>10.1f}"
            f"{s['completion_tokens']:>19.0f}"
        )
    print(
        f"{'ratio':<8}{ratios['iteration_s']:>12.2f}x{ratios['rollout_s']:>10.2f}x{ratios['update_s']:>9.2f}x"
        f"{ratios['completion_tokens']:>18.2f}x"
    )
    print(f"ragen2 / TRL iteration time: {ratios['iteration_s']:.2f} (paired per-repeat median {paired:.2f})")
    print(
        f"prompt tokens per group: {[len(p['ids']) for p in prompts[: args.groups]]}; worker logs in {work}"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
