"""One status line per iteration: what a researcher watches in a SLURM log (the ``ragen2`` logger).

The numbers are fields of the module's record of the iteration (``PolicyModule.last``, an ``Iteration``:
its rollouts, filter, MI pass and update) and the latest regime reading of the module's ``Findings``
(``CollapseMonitor``), shown from the run's first MI pass on. The line is written at the end of the
iteration (epoch), after every callback's batch-end hook, so it does not depend on the order of the
callbacks. A number the iteration lacks is left out (an update the filter skipped, an iteration without an
MI pass, a number that is not finite); the count of skipped non-finite optimizer steps shows only when there were some."""

from __future__ import annotations

import math

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from ragen2.diagnostics.findings import held_findings
from ragen2.diagnostics.regimes import RegimeReading
from ragen2.log import log
from ragen2.modules.record import Iteration, last_iteration

Shown = tuple[str, float | None, str]  # (name, value or None when absent, format)


def numbers(it: Iteration, regime: RegimeReading | None) -> list[Shown]:
    """The line's numbers, in order."""
    rollout, groups, update = it.rollouts.rollout, it.rollouts.groups, it.update
    first_turn = None if it.mi is None else it.mi.curves.get("first_turn")
    proxies = {} if first_turn is None or first_turn.proxies is None else first_turn.proxies
    return [
        ("success", None if rollout is None else rollout.success, "{:.2f}"),
        ("return", None if rollout is None else rollout.return_, "{:+.2f}"),
        ("format", None if rollout is None else rollout.format_valid_rate, "{:.2f}"),
        # the groups by outcome (shares): only mixed ones give a success-only reward an advantage
        ("all_ok", None if groups is None else groups.all_success, "{:.2f}"),
        ("all_fail", None if groups is None else groups.all_fail, "{:.2f}"),
        ("mixed", None if groups is None else groups.mixed, "{:.2f}"),
        ("kept", it.rollouts.filter.get("kept"), "{:.0f}"),  # the filter's own statistic (groups kept)
        ("eff_reward", None if update is None else update.advantage.effective_reward, "{:+.2f}"),
        ("loss", None if update is None else update.terms.get("loss"), "{:+.4f}"),
        ("steps", None if update is None else update.steps, "{:.0f}"),
        # a warning sign, not a number to read every iteration
        ("nonfinite", update.nonfinite if update is not None and update.nonfinite else None, "{:.0f}"),
        ("mi", proxies.get("mi_est"), "{:+.3f}"),
        ("retr", proxies.get("retrieval_acc"), "{:.2f}"),
        ("regime", None if regime is None else float(regime.declared), "{:.0f}"),
        ("rollout_s", it.rollouts.rollout_s, "{:.0f}"),
        ("update_s", it.update_s, "{:.0f}"),
    ]


class IterationSummary(L.Callback):
    @rank_zero_only
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        it = last_iteration(pl_module)
        if it is None:
            return
        findings = held_findings(pl_module)
        shown = numbers(it, None if findings is None else findings.regime)
        parts = [f"{name} {fmt.format(v)}" for name, v, fmt in shown if v is not None and math.isfinite(v)]
        log.info("iteration %d: %s", trainer.current_epoch, " | ".join(parts))
