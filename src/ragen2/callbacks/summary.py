"""One status line per iteration: what a researcher watches in a SLURM log (the ``ragen2`` logger).

The numbers are the module's (``last_metrics``: the iteration's rollout, filter, MI and update numbers) and
the latest regime reading of the module's ``Findings`` (``CollapseMonitor``), shown from the run's first
MI pass on. The line is written at the end of the iteration (epoch), after every callback's batch-end
hook, so it does not depend on the order of the callbacks. A number missing from the iteration is left
out; the count of skipped non-finite optimizer steps (``train/nonfinite_steps``) shows only when there were
some."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from ragen2.data.contracts import reported_metrics
from ragen2.diagnostics.findings import held_findings
from ragen2.log import log

KEYS = (
    ("success", "rollout/success", "{:.2f}"),
    ("return", "rollout/return", "{:+.2f}"),
    ("format", "rollout/format_valid_rate", "{:.2f}"),
    # the groups by outcome (shares): only mixed ones give a success-only reward an advantage
    ("all_ok", "rollout/groups_all_success", "{:.2f}"),
    ("all_fail", "rollout/groups_all_fail", "{:.2f}"),
    ("mixed", "rollout/groups_mixed", "{:.2f}"),
    ("kept", "filter/kept", "{:.0f}"),
    ("eff_reward", "train/effective_reward", "{:+.2f}"),
    ("loss", "train/loss", "{:+.4f}"),
    ("steps", "train/optimizer_steps", "{:.0f}"),
    ("nonfinite", "train/nonfinite_steps", "{:.0f}"),
    ("mi", "diag/first_turn/mi_est", "{:+.3f}"),
    ("retr", "diag/first_turn/retrieval_acc", "{:.2f}"),
    ("regime", "diag/regime", "{:.0f}"),
    ("rollout_s", "time/rollout", "{:.0f}"),
    ("update_s", "time/update", "{:.0f}"),
)

WHEN_NONZERO = {"train/nonfinite_steps"}  # a warning sign, not a number to read every iteration


class IterationSummary(L.Callback):
    @rank_zero_only
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metrics = dict(reported_metrics(pl_module))
        findings = held_findings(pl_module)
        if findings is not None and findings.regime is not None:
            metrics.update(findings.regime.as_metrics())
        shown = {k: v for k, v in metrics.items() if k not in WHEN_NONZERO or v != 0}
        parts = [f"{name} {fmt.format(shown[key])}" for name, key, fmt in KEYS if key in shown]
        log.info("iteration %d: %s", trainer.current_epoch, " | ".join(parts))
