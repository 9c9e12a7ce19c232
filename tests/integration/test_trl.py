"""ragen2's collapse diagnostics in a real TRL ``GRPOTrainer`` run (CPU, the built-in model), and
``ragen2-diagnose`` on the completions log that run writes.

The policy is the built-in SmolLM2-135M sampling for real; the prompts make its completions carry a reasoning
span: a few worked examples of ``Word: <w>`` / ``Reply: <think>the word is <w></think> <w>``, then a new word
and ``Reply: <think>``, so that the model continues the span the prompt opened (most samples close it within a
dozen tokens). The reward is 1 for a reply that ends the span and repeats the word, else 0.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]' (trl==1.16.0)")
pytestmark = pytest.mark.slow

WORDS = ("cloud", "stone", "tiger", "lemon")
SHOTS = (
    "Repeat the word inside the think tags, then answer it.\n"
    "Word: apple\nReply: <think>the word is apple</think> apple\n"
    "Word: river\nReply: <think>the word is river</think> river\n"
)
GROUP_SIZE = 2
STEPS = 2
MIN_ROWS = 4  # of the 8 completions a pass sees; the seeded run closes the span in more


def prompt(word: str) -> str:
    return f"{SHOTS}Word: {word}\nReply: <think>"


def echo_reward(completions: list[str], word: list[str], **_: Any) -> list[float]:
    """1 when the completion closes the reasoning and then says the prompt's word."""
    return [
        1.0 if c.partition("</think>")[2].strip().startswith(w) else 0.0 for c, w in zip(completions, word)
    ]


def grpo_run(out: Path, steps: int = STEPS, every_n_steps: int | None = 1) -> tuple[Any, Any]:
    """A short GRPOTrainer run writing its completions log under ``out``: (the trainer, the attached
    ``CollapseDiagnostics``, or None with ``every_n_steps=None``)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from ragen2.integrations.trl import CollapseDiagnostics
    from ragen2.models import load_tokenizer
    from ragen2.models.loading import resolve_model_path

    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=len(WORDS) * GROUP_SIZE,  # every prompt in every step
        num_generations=GROUP_SIZE,
        max_completion_length=12,
        max_steps=steps,
        learning_rate=1e-6,
        temperature=1.0,
        beta=0.0,
        shuffle_dataset=False,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        log_completions=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=resolve_model_path("builtin"),
        reward_funcs=echo_reward,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": prompt(w), "word": w} for w in WORDS] * steps),
        processing_class=load_tokenizer("builtin"),
    )
    diagnostics = None if every_n_steps is None else CollapseDiagnostics(every_n_steps).attach(trainer)
    trainer.train()
    return trainer, diagnostics


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    """One real run with the diagnostics every step: (trainer, diagnostics, its output folder)."""
    out = tmp_path_factory.mktemp("trl")
    trainer, diagnostics = grpo_run(out)
    return trainer, diagnostics, out


def _logged(trainer: Any, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_the_diagnostics_reach_the_trainers_logs(trl_run: tuple[Any, Any, Path]) -> None:
    trainer, diagnostics, _ = trl_run
    assert diagnostics.passes == STEPS
    rows = _logged(trainer, "diag/first_turn/rows")
    assert len(rows) == STEPS and min(rows) >= MIN_ROWS, rows  # a pass that scores nothing fails here
    assert diagnostics.rows_scored == sum(rows)
    assert _logged(trainer, "diag/first_turn/columns") == [len(WORDS)] * STEPS
    for key in ("mi_est", "contrast", "cond_entropy", "retrieval_acc"):
        assert all(math.isfinite(v) for v in _logged(trainer, f"diag/first_turn/{key}")), key
    assert all(0.0 <= v <= 1.0 for v in _logged(trainer, "diag/first_turn/retrieval_acc"))
    assert all(0.0 <= v <= math.log(len(WORDS)) + 1e-6 for v in _logged(trainer, "diag/first_turn/mi_est"))
    # the reasoning copies its prompt's word: retrieval well above chance (1/4)
    assert max(_logged(trainer, "diag/first_turn/retrieval_acc")) >= 0.75
    assert all(v in (0.0, 1.0, 2.0, 3.0) for v in _logged(trainer, "diag/regime"))
    assert _logged(trainer, "diag/regime")[0] == 0.0  # the first pass is the reference: healthy
    assert all(0.0 <= v <= 1.0 for v in _logged(trainer, "diag/zero_variance_share"))
    assert all(v > 0 for v in _logged(trainer, "time/diagnostics"))
    # the same rows TRL logs: its own zero-std share agrees with ours
    assert _logged(trainer, "diag/zero_variance_share") == pytest.approx(
        _logged(trainer, "frac_reward_zero_std")
    )


def test_ragen2_diagnose_reads_the_completions_log(trl_run: tuple[Any, Any, Path], tmp_path: Path) -> None:
    pytest.importorskip(
        "ragen2.diagnostics.readers",
        reason="ragen2-diagnose reads TRL's log once ragen2.diagnostics.readers exists",
    )
    import json

    from ragen2.config import compose
    from ragen2.diagnose import run

    _, _, out = trl_run
    logs = sorted((out / "completions").glob("completions_*.parquet"))
    assert len(logs) == STEPS, logs
    report = tmp_path / "report"
    overrides = [f"rollouts={out}", "model.name_or_path=builtin", f"output={report}"]
    diag = run(compose(overrides, config_name="diagnose"), overrides)
    record = json.loads((report / "metrics.json").read_text())
    assert len(diag.rows) >= MIN_ROWS and record["metrics"]["rows"] >= MIN_ROWS
    assert record["metrics"]["columns"] == len(WORDS)
