"""MI diagnostics as a callback that owns its torchmetrics Metric (METHOD.md §3).

Before the update of iteration 0 and of every ``every_n_iterations``-th iteration, on the unfiltered
batch: up to ``num_samples`` first-turn (X, Z) rows with a valid Z are cross-scored under the policy
(``ragen2.diagnostics.cross_score``) and the MI proxies are computed by ``MIMetric``, whose EMA state
is this callback's checkpointed state. The numbers join the iteration's metrics (``batch.metrics``,
``diag/first_turn/*``), so the module logs them with its own.
"""

from __future__ import annotations

import random
import time
from typing import Any

import lightning as L

from ragen2.config import ConfigError
from ragen2.data.batch import RolloutBatch
from ragen2.data.contracts import HoldsPolicy
from ragen2.diagnostics.cross_scoring import cross_score
from ragen2.diagnostics.metric import MIMetric


class MIDiagnostics(L.Callback):
    """First-turn MI proxies of the unfiltered batch, under the policy as it sampled."""

    def __init__(
        self, enabled: bool = True, every_n_iterations: int = 5, num_samples: int = 64, seed: int = 0
    ) -> None:
        if every_n_iterations < 0:
            raise ConfigError(
                f"diagnostics.every_n_iterations={every_n_iterations} must be ≥ 0 (0 = never). "
                "Fix: diagnostics.every_n_iterations=5"
            )
        if num_samples < 2:
            raise ConfigError(
                f"diagnostics.num_samples={num_samples}: MI needs at least two (X, Z) rows to compare. "
                "Fix: diagnostics.num_samples=64"
            )
        self.enabled = enabled
        self.every_n_iterations = every_n_iterations
        self.num_samples = num_samples
        self.seed = seed
        self.first_turn = MIMetric()

    def due(self, iteration: int) -> bool:
        every = self.every_n_iterations
        return self.enabled and every > 0 and iteration % every == 0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if (
            isinstance(batch, RolloutBatch)
            and isinstance(pl_module, HoldsPolicy)
            and self.due(batch.iteration)
        ):
            batch.metrics.update(self.measure(pl_module.policy, batch))

    def measure(self, policy: Any, batch: RolloutBatch) -> dict[str, float]:
        """``diag/first_turn/*`` of one batch (also callable from a notebook)."""
        start = time.perf_counter()
        rows = [
            (ep.turns[0].prompt_ids, ep.turns[0].reasoning_ids)
            for ep in batch.episodes
            if ep.turns and ep.turns[0].reasoning_ids
        ]
        out = {"diag/first_turn/valid_rows": float(len(rows))}
        if len({tuple(x) for x, _ in rows}) < 2:
            return out  # MI needs at least two distinct prompts with a valid Z
        rng = random.Random(self.seed * 131 + batch.iteration)
        if len(rows) > self.num_samples:
            rows = rng.sample(rows, self.num_samples)
        scores = cross_score(policy, rows)
        self.first_turn.update(scores.logp_sum, scores.prompt_index, scores.num_tokens)
        out.update({f"diag/first_turn/{k}": float(v) for k, v in self.first_turn.compute().items()})
        out["diag/first_turn/columns"] = float(scores.logp_sum.shape[1])
        out["time/diagnostics"] = time.perf_counter() - start
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"first_turn": self.first_turn.get_extra_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.first_turn.set_extra_state(state_dict["first_turn"])
