"""``ragen2.integrations.trl`` against a stand-in for TRL's ``GRPOTrainer`` (no TRL needed): when the hook runs a
pass, what it reads of the trainer, what it refuses; the real trainer is tests/integration/test_trl.py's."""

from __future__ import annotations

import math
from collections import defaultdict, deque
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ragen2.diagnostics.report import Splits
from ragen2.integrations.trl import (
    PREFIX,
    CollapseDiagnostics,
    Generation,
    group_rewards,
    pass_metrics,
    weighted_rewards,
)

WORDS = ("cloud", "stone", "tiger")


class StandIn:
    """What the hook uses of GRPOTrainer: each generation logs every prompt twice (G = 2) with its
    completions (``closed``: whether they end the reasoning span) and rewards, as TRL 1.16 does."""

    def __init__(self, model: Any, tokenizer: Any, closed: bool = True, logging_steps: int = 1) -> None:
        size = len(WORDS) * 2
        self.model = SimpleNamespace(training=True)
        self.processing_class = tokenizer
        self._logs: dict[str, Any] = {
            "prompt": deque(maxlen=size),
            "completion": deque(maxlen=size),
            "rewards": defaultdict(lambda: deque(maxlen=size)),
        }
        self._metrics: dict[str, Any] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.reward_weights = torch.ones(1)
        self.num_generations = 2
        self.accelerator = SimpleNamespace(
            num_processes=1, is_main_process=True, unwrap_model=lambda _: model
        )
        self.state = SimpleNamespace(global_step=0)
        self.args = SimpleNamespace(logging_steps=logging_steps, logging_strategy="steps")
        self.callbacks: list[Any] = []
        self.closed = closed

    def add_callback(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, int]:
        for i, x in enumerate(inputs):
            end = "</think> " if self.closed else " "
            self._logs["prompt"].append(x["prompt"])
            self._logs["completion"].append(f"the word is {x['word']}{end}{x['word']}")
            self._logs["rewards"]["echo"].append(float(i % 4 == 0))  # group 0: [1, 0]; 1: [0, 0]; 2: [1, 0]
        return {"rows": len(inputs)}

    def step(self) -> dict[str, int]:
        batch = [{"prompt": f"Word: {w}\nReply: <think>", "word": w} for w in WORDS for _ in range(2)]
        out = self._generate_and_score_completions(batch)
        self.state.global_step += 1
        return out


def test_rewards_are_summed_as_grpo_trainer_sums() -> None:
    # row 0: 1·1 + 0.5·2 = 2; row 1: both functions returned None -> NaN; row 2: 1·0 (the NaN adds nothing)
    rewards = weighted_rewards([[1.0, math.nan, 0.0], [2.0, math.nan, math.nan]], [1.0, 0.5])
    assert rewards[0] == 2.0 and math.isnan(rewards[1]) and rewards[2] == 0.0
    assert group_rewards([1.0, 1.0, 0.0, math.nan], 2) == {0: [1.0, 1.0], 1: [0.0]}


def test_a_pass_every_n_steps_from_the_first(tokenizer: Any, tiny_model: Any) -> None:
    trainer = StandIn(tiny_model, tokenizer)
    diagnostics = CollapseDiagnostics(every_n_steps=3).attach(trainer)
    assert trainer.callbacks == [diagnostics]
    for _ in range(7):  # steps 0 … 6: passes at 0, 3 and 6
        assert trainer.step() == {"rows": 6}  # the trainer's own output goes on untouched
    assert diagnostics.passes == 3
    metrics = trainer._metrics["train"]
    assert metrics[PREFIX + "rows"] == [6.0] * 3 and metrics[PREFIX + "columns"] == [3.0] * 3
    assert metrics["diag/zero_variance_share"] == [pytest.approx(1 / 3)] * 3  # group 1 only: [0, 0]
    assert metrics["diag/regime"][0] == 0.0 and len(metrics["diag/regime_raw"]) == 3
    assert diagnostics.rows_scored == 18


def test_eval_generations_are_not_scored(tokenizer: Any, tiny_model: Any) -> None:
    trainer = StandIn(tiny_model, tokenizer)
    diagnostics = CollapseDiagnostics(every_n_steps=1).attach(trainer)
    trainer.model.training = False
    trainer.step()
    assert diagnostics.passes == 0 and not trainer._metrics["train"]


def test_completions_without_reasoning_are_counted_not_scored(tokenizer: Any, tiny_model: Any) -> None:
    trainer = StandIn(tiny_model, tokenizer, closed=False)
    diagnostics = CollapseDiagnostics(every_n_steps=1).attach(trainer)
    trainer.step()
    metrics = trainer._metrics["train"]
    assert metrics[PREFIX + "valid_rows"] == [0.0] and metrics[PREFIX + "skipped_rows"] == [6.0]
    assert PREFIX + "mi_est" not in metrics and "diag/regime" not in metrics
    assert diagnostics.rows_scored == 0


def test_max_prompts_caps_the_columns(tokenizer: Any, tiny_model: Any) -> None:
    rows = [f"Word: {w}\nReply: <think>" for w in WORDS for _ in range(2)]
    gen = Generation(rows, [f"the word is {w}</think>" for w in WORDS for _ in range(2)], [0.0] * 6, 2)
    metrics = pass_metrics(tiny_model, tokenizer, gen, max_prompts=2, splits=Splits())
    assert metrics[PREFIX + "columns"] == 2.0 and metrics[PREFIX + "rows"] == 4.0


def test_bad_settings_and_other_trainers_are_refused(tokenizer: Any, tiny_model: Any) -> None:
    with pytest.raises(ValueError, match="every_n_steps=0"):
        CollapseDiagnostics(every_n_steps=0)
    with pytest.raises(ValueError, match="max_prompts=1"):
        CollapseDiagnostics(max_prompts=1)
    with pytest.raises(TypeError, match="_generate_and_score_completions.*trl==1.16.0"):
        CollapseDiagnostics().attach(SimpleNamespace())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="logging_steps=5"):
        CollapseDiagnostics(every_n_steps=2).attach(StandIn(tiny_model, tokenizer, logging_steps=5))
    attached = CollapseDiagnostics().attach(StandIn(tiny_model, tokenizer))
    with pytest.raises(RuntimeError, match="attached already"):
        attached.attach(StandIn(tiny_model, tokenizer))


def test_a_callback_never_attached_is_refused() -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    with pytest.raises(RuntimeError, match=r"attach\(trainer\)"):
        CollapseDiagnostics().on_train_begin(TrainingArguments("unused"), TrainerState(), TrainerControl())
