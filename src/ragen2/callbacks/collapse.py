"""``CollapseMonitor``: the regime of each MI pass, logged as ``diag/regime``, and the template-collapse alarm.

After every iteration it reads the iteration's ``MIPass`` from the module's ``Findings`` (left there by
``MIDiagnostics`` before the update; the ``mode`` curve's ``PassMetrics``); on iterations with a pass it
advances the classifier of ``ragen2.diagnostics.regimes``, leaves its ``RegimeReading`` in the findings
(the summary line shows it) and logs ``diag/regime`` (the declared regime's code: 0 healthy, 1 template collapse, 2 compressed,
3 collapsed) and ``diag/regime_raw`` (the pass on its own, before patience). When input dependence is
first declared lost (template collapse, or collapsed reached directly) it warns once with the evidence,
the pass's numbers against the first pass's and the thresholds; with ``on_collapse: stop`` it also ends
the run after the iteration, at that pass and at every later pass still in an alarm regime. Iterations
without a pass (between ``diagnostics.every_n_iterations``, or too few distinct prompts) leave the state
alone: patience counts passes, not iterations.

Several processes: each rank classifies the numbers it sees; the stop decision is reduced over ranks
(any rank's alarm stops all) every iteration, so every rank takes part in the same collective and all
stop together even if their metrics differed.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from ragen2.curves import CURVE
from ragen2.data.contracts import log_row
from ragen2.diagnostics.findings import held_findings
from ragen2.diagnostics.mi_pass import MIPass
from ragen2.diagnostics.regimes import RegimeReading, RegimeState, RegimeThresholds, evidence, step
from ragen2.distributed import Ranks
from ragen2.errors import ConfigError
from ragen2.log import log

ACTIONS = ("warn", "stop")
KEY = "callbacks.collapse"


class CollapseMonitor(L.Callback):
    """Regimes of the ``mode`` curve's MI passes (``first_turn``, ``trajectory``, ``turn_<t>`` or ``heldout``)."""

    def __init__(
        self,
        mode: str = "first_turn",
        on_collapse: str = "warn",
        patience: int = 2,
        entropy_fraction: float = 0.5,
        mi_fraction: float = 0.5,
    ) -> None:
        if not isinstance(mode, str) or not CURVE.fullmatch(mode):
            raise ConfigError(
                f"{KEY}.mode={mode!r} is not a curve the MI pass logs: first_turn, trajectory, turn_<t> "
                f"(t ≥ 2, with per_turn in diagnostics.modes) or heldout (with diagnostics.heldout.num_seeds > 0). "
                f"Fix: {KEY}.mode=first_turn"
            )
        if on_collapse not in ACTIONS:
            raise ConfigError(
                f"{KEY}.on_collapse={on_collapse!r} must be one of {', '.join(ACTIONS)} "
                f"(to switch the monitor off: {KEY}=null). Fix: {KEY}.on_collapse=warn"
            )
        try:
            self.thresholds = RegimeThresholds(entropy_fraction, mi_fraction, patience)
        except ValueError as err:
            raise ConfigError(f"{KEY}.{err}".replace("Fix: ", f"Fix: {KEY}.")) from None
        self.mode = mode
        self.on_collapse = on_collapse
        self.state = RegimeState()

    @property
    def state_key(self) -> str:
        return self._generate_state_key(mode=self.mode)  # one monitor per curve can coexist

    def observe(self, mi: MIPass | None, iteration: int) -> RegimeReading | None:
        """Advance on ``mi`` if it is this iteration's pass and has MI on the ``mode`` curve; returns what
        was read (None without such a pass)."""
        now = None if mi is None or mi.iteration != iteration else mi.regime_input(self.mode)
        if now is None:
            return None
        before = self.state.regime
        result = step(self.state, now, self.thresholds)
        self.state = result.state
        assert self.state.first is not None
        if result.alarm_began:
            _warn(
                "%s at iteration %d (%s MI pass %d, patience %d): input dependence lost%s; %s%s",
                self.state.regime.label,
                iteration,
                self.mode,
                self.state.passes,
                self.thresholds.patience,
                ", while H(Z|X) holds (entropy alone does not show it)" if not self.state.entropy_low else "",
                evidence(now, self.state.first, self.thresholds),
                "; stopping (on_collapse=stop)" if self.on_collapse == "stop" else "",
            )
        elif result.changed:
            _info("regime at iteration %d: %s → %s", iteration, before.label, self.state.regime.label)
        return RegimeReading(iteration, self.state.regime, result.raw)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        findings = held_findings(pl_module)
        reading = self.observe(None if findings is None else findings.mi, trainer.current_epoch)
        if findings is not None and reading is not None:
            findings.regime = reading
            log_row(pl_module, reading.as_metrics())
        if self.on_collapse == "stop":
            # a collective on every iteration, pass or not, so that no rank waits on another
            local = reading is not None and reading.declared.alarm
            if Ranks.current().any(local):
                if not local:
                    _warn(
                        "stopping after iteration %d: another rank declared input dependence lost",
                        trainer.current_epoch,
                    )
                trainer.should_stop = True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.state.first is None:
            _info("collapse monitor: no diag/%s/ MI pass in this run, so no regime", self.mode)

    def state_dict(self) -> dict[str, Any]:
        return self.state.to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state = RegimeState.from_dict(state_dict)
        if state_dict.get("first") is not None and self.state.first is None:
            _info(
                "collapse monitor: the checkpoint's reference pass has no contrast; the next MI pass replaces it"
            )


@rank_zero_only
def _warn(msg: str, *args: Any) -> None:
    log.warning(msg, *args)


@rank_zero_only
def _info(msg: str, *args: Any) -> None:
    log.info(msg, *args)
