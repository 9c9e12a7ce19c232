"""The MI pass as a callback: when it runs, what it adds to the iteration's metrics, what it checkpoints."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate

from ragen2.callbacks import MIDiagnostics
from ragen2.config import compose
from ragen2.data import RolloutBatch


@pytest.fixture(scope="module")
def batch() -> RolloutBatch:
    cfg = compose(["model=tiny", "rollout=scripted", "rollout.groups=4"])
    return instantiate(cfg.data).rollout(0)


def test_due_at_iteration_zero_and_every_n() -> None:
    assert [i for i in range(12) if MIDiagnostics(every_n_iterations=5).due(i)] == [0, 5, 10]
    assert not any(MIDiagnostics(enabled=False).due(i) for i in range(12))
    assert not any(MIDiagnostics(every_n_iterations=0).due(i) for i in range(12))


def test_measure_adds_the_family_and_checkpoints_the_ema(batch: RolloutBatch, tiny_model) -> None:
    callback = MIDiagnostics(num_samples=8)
    out = callback.measure(tiny_model, batch)
    assert 2 <= out["diag/first_turn/columns"] <= 4 and out["diag/first_turn/valid_rows"] >= 8
    for key in ("mi_est", "cond_entropy", "retrieval_acc", "retrieval_chance@2", "mi_zscore_ema"):
        assert f"diag/first_turn/{key}" in out
    assert out["diag/first_turn/retrieval_chance"] == pytest.approx(1 / out["diag/first_turn/columns"])
    state = callback.state_dict()
    assert state["first_turn"]["sigma_ema"] is not None
    # a resumed callback carries the EMA on: its next pass equals the original's
    resumed = MIDiagnostics(num_samples=8)
    resumed.load_state_dict(state)
    assert resumed.measure(tiny_model, batch)["diag/first_turn/mi_zscore_ema"] == pytest.approx(
        callback.measure(tiny_model, batch)["diag/first_turn/mi_zscore_ema"]
    )


def test_a_batch_with_one_prompt_has_no_mi(batch: RolloutBatch, tiny_model) -> None:
    one_group = batch.select(batch.group_index.eq(0).nonzero().squeeze(-1))
    out = MIDiagnostics().measure(tiny_model, one_group)
    assert list(out) == ["diag/first_turn/valid_rows"]
