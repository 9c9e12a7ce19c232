"""ragen2's collapse diagnostics, live in TRL's ``GRPOTrainer`` (TRL 1.16): ``CollapseDiagnostics``.

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...))
    CollapseDiagnostics(every_n_steps=10).attach(trainer)
    trainer.train()

At the first generation batch and then every ``every_n_steps`` optimizer steps, right after the trainer has
generated and rewarded a batch and before it trains on it, the batch's prompts and completions become
first-turn (X, Z) rows exactly as ``ragen2-diagnose`` reads TRL's completions log
(``ragen2.diagnostics.readers.row_from_text``: X the prompt through ``<think>``, Z the completion's reasoning
span; a completion without one is counted and skipped) and are cross-scored with the trainer's own model as
it is before the update (``ragen2.diagnostics.report.diagnose``: the prefix-cached ``cross_score``, then
``mi_metrics``). The numbers join the trainer's own metrics, so ``GRPOTrainer.log`` averages them into its
next log line and hands them to every logger it reports to (wandb, tensorboard, trackio, …) and to
``trainer.state.log_history``:

- ``diag/first_turn/*``: the MI family (``mi_est``, ``contrast``, …), retrieval (``retrieval_acc``,
  ``retrieval_above_chance``, …), H(Z|X) (``cond_entropy``), ``rows`` scored, ``columns`` (distinct prompts),
  ``valid_rows`` (with a reasoning span; scored when they hold two distinct prompts) and ``skipped_rows``
  (without one);
- ``diag/regime``: the declared regime, relative to the run's first pass and with patience, as ragen2's
  training logs it (``ragen2.diagnostics.regimes``: 0 healthy, 1 template collapse, 2 compressed,
  3 collapsed), ``diag/regime_raw`` (the pass on its own) and ``diag/region`` (the pass against
  ``ragen2-diagnose``'s absolute splits, ``Splits``);
- ``diag/zero_variance_share``: the share of the batch's groups whose rewards are all equal (no advantage);
- ``diag/tokens_processed``, ``diag/token_bound_ratio`` and ``time/diagnostics``: what the pass cost.

Why a callback plus a hook, not a ``GRPOTrainer`` subclass: a ``TrainerCallback`` is handed neither the
prompts, the completions nor the trainer, so something has to reach into the trainer. A mixin would make
every user define a new class, and one whose trainer is already a subclass (their own or another library's)
would have to order the bases. ``attach`` wraps the one trainer's ``_generate_and_score_completions`` and
registers the callback: one line on any ``GRPOTrainer``, subclass or not. The callback's own events refuse a
run it was never attached to and warn at the end when no pass scored a row. The hook reads what TRL 1.16
keeps after each generation (``_logs``: the gathered prompts, completions and per-function rewards, the rows
its ``log_completions`` parquet holds; ``reward_weights``; ``num_generations``) and writes into ``_metrics``,
as TRL's own ``log_metric`` does; ``attach`` refuses a trainer that lacks any of them.

Several processes: TRL gathers every process's prompts, completions and rewards before it logs them, so every
process scores the same rows and logs the same numbers. Tested in one process on CPU
(tests/integration/test_trl.py); sharded models (FSDP, DeepSpeed ZeRO-3) are not. The classifier's state is
not checkpointed: a resumed run takes its first pass as the new reference.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from transformers import ProcessorMixin, TrainerCallback

from ragen2.diagnostics.readers import Completion, Prompt, Skips, row_from_text
from ragen2.diagnostics.regimes import KEYS, PassMetrics, RegimeState, RegimeThresholds, evidence, step
from ragen2.diagnostics.report import Row, Splits, diagnose, reward_picture
from ragen2.log import log

PREFIX = "diag/first_turn/"
SPLITS = Splits()  # ragen2-diagnose's defaults

#: what ``attach`` needs of a trainer: TRL 1.16 GRPOTrainer's attributes the hook reads or wraps
NEEDS = (
    "_generate_and_score_completions",
    "_logs",
    "_metrics",
    "reward_weights",
    "num_generations",
    "accelerator",
    "processing_class",
    "model",
    "state",
    "args",
    "add_callback",
)


class GRPOTrainerLike(Protocol):
    """What ``CollapseDiagnostics`` uses of TRL 1.16's ``GRPOTrainer`` (``NEEDS``)."""

    _generate_and_score_completions: Callable[[Any], Any]
    _logs: dict[str, Any]  # "prompt", "completion": deques; "rewards": {function name: deque}
    _metrics: dict[str, MutableMapping[str, list[float]]]  # mode -> key -> values averaged at log time
    reward_weights: Any  # [F] tensor
    num_generations: int
    accelerator: Any
    processing_class: Any
    model: Any
    state: Any
    args: Any

    def add_callback(self, callback: Any) -> None: ...


@dataclass(frozen=True)
class Generation:
    """One generation batch, gathered from every process: the rows of TRL's completions log."""

    prompts: Sequence[Prompt]  # [B] text or chat messages
    completions: Sequence[Completion]  # [B]
    rewards: Sequence[float]  # [B] Σ_f w_f r_f over the reward functions; NaN where none scored the row
    group_size: int  # G: rows g·G … g·G + G − 1 share one prompt (TRL repeats each prompt G times in a row)


def weighted_rewards(per_function: Sequence[Sequence[float]], weights: Sequence[float]) -> list[float]:
    """Each row's Σ_f w_f r_f, as GRPOTrainer sums: a function's NaN (it returned None) adds nothing, and a row
    that no function scored is NaN. ``per_function``: F lists of B rewards."""
    out = []
    for values in zip(*per_function):
        scored = [w * r for w, r in zip(weights, values) if not math.isnan(r)]
        out.append(sum(scored) if scored else math.nan)
    return out


def group_rewards(rewards: Sequence[float], group_size: int) -> dict[int, list[float]]:
    """Each group's scored rewards (NaN dropped), groups being runs of ``group_size`` rows."""
    groups: dict[int, list[float]] = {}
    for i, r in enumerate(rewards):
        group = groups.setdefault(i // group_size, [])
        if not math.isnan(r):
            group.append(r)
    return groups


def rows_of(gen: Generation, tokenizer: Any, skips: Skips, max_prompts: int | None = None) -> list[Row]:
    """The (X, Z) rows of the batch's first ``max_prompts`` groups (all when None), seeded by group and
    numbered within it; completions without a reasoning span are counted in ``skips``."""
    rows = []
    for i, (prompt, completion) in enumerate(zip(gen.prompts, gen.completions)):
        group, sample = divmod(i, gen.group_size)
        if max_prompts is not None and group >= max_prompts:
            break
        reward = None if math.isnan(gen.rewards[i]) else gen.rewards[i]
        row = row_from_text(tokenizer, prompt, completion, group, sample, reward, skips)
        if row is not None:
            rows.append(row)
    return rows


def pass_metrics(
    model: Any, tokenizer: Any, gen: Generation, max_prompts: int | None, splits: Splits
) -> dict[str, float]:
    """One pass over a batch: ``diag/first_turn/*``, ``diag/region``, ``diag/zero_variance_share`` and the
    cost. Without two distinct prompts among the scored rows only the counts and the reward picture (MI
    compares prompts)."""
    start = time.perf_counter()
    skips = Skips()
    rows = rows_of(gen, tokenizer, skips, max_prompts)
    out = {PREFIX + "valid_rows": float(len(rows)), PREFIX + "skipped_rows": float(skips.total)}
    picture = reward_picture(group_rewards(gen.rewards, gen.group_size))
    if "zero_variance_share" in picture:
        out["diag/zero_variance_share"] = picture["zero_variance_share"]
    if len({row.prompt_ids for row in rows}) >= 2:
        diag = diagnose(model, rows, splits)
        metrics = dict(diag.metrics)
        out["diag/region"] = metrics.pop("regime")
        out["diag/tokens_processed"] = metrics.pop("tokens_processed")
        out["diag/token_bound_ratio"] = metrics.pop("token_bound_ratio")
        metrics.pop("token_bound")
        out |= {PREFIX + k: v for k, v in metrics.items()}
    out["time/diagnostics"] = time.perf_counter() - start
    return {k: v for k, v in out.items() if math.isfinite(v)}  # TRL's log averages a NaN into None


def regime_input(metrics: dict[str, float]) -> PassMetrics | None:
    """The pass's numbers for the regimes, or None when the pass has no MI."""
    if not all(PREFIX + key in metrics for key in KEYS):
        return None
    return PassMetrics(*(metrics[PREFIX + key] for key in KEYS))


def generation(trainer: GRPOTrainerLike, rows: int) -> Generation:
    """The last ``rows`` rows TRL logged: the batch just generated, every process's rows gathered."""
    logs = trainer._logs
    per_function = [list(values)[-rows:] for values in logs["rewards"].values()]
    weights = [float(w) for w in trainer.reward_weights]
    return Generation(
        prompts=list(logs["prompt"])[-rows:],
        completions=list(logs["completion"])[-rows:],
        rewards=weighted_rewards(per_function, weights),
        group_size=trainer.num_generations,
    )


def scoring_model(trainer: GRPOTrainerLike) -> Any:
    """The trainer's model as a transformers causal LM: unwrapped from DDP, and a PEFT model's base model
    (its LoRA layers included), which is what ``cross_score`` accepts."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class CollapseDiagnostics(TrainerCallback):
    """The MI pass of ragen2's training, every ``every_n_steps`` optimizer steps of a ``GRPOTrainer`` (see the
    module doc). ``max_prompts`` caps the groups scored per pass (the cost grows with prompts × rows); the
    regime's ``patience``, ``entropy_fraction`` and ``mi_fraction`` are ``RegimeThresholds``'; ``splits`` is
    ``diag/region``'s."""

    def __init__(
        self,
        every_n_steps: int = 10,
        max_prompts: int | None = None,
        patience: int = 2,
        entropy_fraction: float = 0.5,
        mi_fraction: float = 0.5,
        splits: Splits = SPLITS,
    ) -> None:
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(
                f"every_n_steps={every_n_steps!r} must be an integer ≥ 1: the optimizer steps between two MI "
                "passes. Fix: every_n_steps=10"
            )
        if max_prompts is not None and (not isinstance(max_prompts, int) or max_prompts < 2):
            raise ValueError(
                f"max_prompts={max_prompts!r} must be None (every group) or an integer ≥ 2: MI compares "
                "prompts. Fix: max_prompts=None"
            )
        self.thresholds = RegimeThresholds(entropy_fraction, mi_fraction, patience)
        self.every_n_steps = every_n_steps
        self.max_prompts = max_prompts
        self.splits = splits
        self.state = RegimeState()
        self.passes = 0  # passes run
        self.rows_scored = 0  # rows cross-scored over all passes
        self.attached = False
        self._next_step = 0  # the optimizer step from which the next generation batch gets a pass

    def attach(self, trainer: GRPOTrainerLike) -> CollapseDiagnostics:
        """Score ``trainer``'s generation batches from now on and register this callback with it."""
        missing = [name for name in NEEDS if not hasattr(trainer, name)]
        if missing:
            raise TypeError(
                f"{type(trainer).__name__} lacks {', '.join(missing)}: CollapseDiagnostics attaches to TRL's "
                "GRPOTrainer (tested with trl==1.16.0). Fix: pip install 'trl==1.16.0'"
            )
        if self.attached:
            raise RuntimeError("this CollapseDiagnostics is attached already; build one per trainer")
        logging_steps = trainer.args.logging_steps
        if (
            trainer.args.logging_strategy == "steps"
            and logging_steps >= 1
            and self.every_n_steps < logging_steps
        ):
            # TRL averages a key over its logging window: two passes in one line would average regime codes
            raise ValueError(
                f"every_n_steps={self.every_n_steps} is below the trainer's logging_steps={logging_steps}: "
                f"passes would be averaged together. Fix: every_n_steps={int(logging_steps)} or more"
            )
        generate = trainer._generate_and_score_completions

        @functools.wraps(generate)
        def generate_and_diagnose(inputs: Any) -> Any:
            output = generate(inputs)
            done = trainer.state.global_step
            if trainer.model.training and done >= self._next_step:
                # the first batch at or after each multiple: with steps_per_generation > 1 a batch spans steps
                self._next_step = (done // self.every_n_steps + 1) * self.every_n_steps
                gathered = len(inputs) * trainer.accelerator.num_processes
                metrics = self.measure(trainer, gathered)
                for key, value in metrics.items():
                    trainer._metrics["train"][key].append(value)
            return output

        trainer._generate_and_score_completions = generate_and_diagnose
        trainer.add_callback(self)
        self.attached = True
        return self

    def measure(self, trainer: GRPOTrainerLike, rows: int) -> dict[str, float]:
        """One pass over the trainer's last ``rows`` logged rows, the regime advanced; the logged numbers."""
        tokenizer = trainer.processing_class
        if isinstance(tokenizer, ProcessorMixin):  # a multimodal model's processor: its text half
            tokenizer = tokenizer.tokenizer
        metrics = pass_metrics(
            scoring_model(trainer), tokenizer, generation(trainer, rows), self.max_prompts, self.splits
        )
        self.passes += 1
        self.rows_scored += int(metrics.get(PREFIX + "rows", 0))
        now = regime_input(metrics)
        if now is not None:
            result = step(self.state, now, self.thresholds)
            self.state = result.state
            metrics["diag/regime"] = float(result.state.regime)
            metrics["diag/regime_raw"] = float(result.raw)
            if result.alarm_began and trainer.accelerator.is_main_process and result.state.first is not None:
                log.warning(
                    "%s at step %d: input dependence lost; %s",
                    result.state.regime.label,
                    trainer.state.global_step,
                    evidence(now, result.state.first, self.thresholds),
                )
        return metrics

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.attached:
            raise RuntimeError(
                "CollapseDiagnostics was passed to the trainer but never attached, so it sees no prompts or "
                "completions. Fix: CollapseDiagnostics(...).attach(trainer) instead of callbacks=[...]"
            )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.rows_scored == 0 and state.is_world_process_zero:
            log.warning(
                "CollapseDiagnostics scored no rows in %d passes: no completion closed a <think>…</think> "
                "span (or fewer than 2 distinct prompts had one). Fix: prompts that open <think>, or a larger "
                "max_completion_length",
                self.passes,
            )
