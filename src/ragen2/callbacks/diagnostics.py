"""MI diagnostics as a callback that owns one torchmetrics Metric per sampling curve (docs/method.md §3).

Before the update of iteration 0 and of every ``every_n_iterations``-th iteration, on the unfiltered
batch, each mode in ``modes`` draws up to its ``num_samples`` budget of (X, Z) rows with a valid Z
(``ragen2.diagnostics.sampling``), the rows are cross-scored under the policy and each curve's ``MIMetric``
computes the MI proxies (``ragen2.diagnostics.mi_pass``). X is the turn's exact context
(``Turn.prompt_ids``: the system prompt and every earlier turn included), Z its sampled reasoning ids
(``Turn.reasoning_ids``).

Modes and the curves they log (``diag/<curve>/*``, each curve with its own EMA state in the checkpoint):
``first_turn``; ``trajectory``; ``per_turn`` → ``turn_2``, ``turn_3``, …. ``diag/<curve>/rows`` is R,
``valid_rows`` the rows the curve could draw from; ``columns`` and ``chance`` are read as
``ragen2.diagnostics.mi_pass`` explains.

The pass is an ``MIPass``, left in the module's ``Findings`` (``ragen2.diagnostics.findings``): the module
logs it with the iteration's own numbers and ``CollapseMonitor`` classifies it.

Cost, each pass: ``diag/tokens_processed`` (positions the model ran, all curves),
``diag/token_bound_ratio`` (that over the minimum, Σ over curves of ``CrossScores.token_bound``: the
distinct X's prefix tree plus C · Σ_r |z_r|; ≈ 1 means no wasted forward) and ``time/diagnostics``
(seconds).

``heldout`` (``diagnostics.heldout.num_seeds`` > 0): the same ``num_seeds`` held-out instances (the first of
validation's, never trained on) × ``samples`` first turns, sampled at each pass from the policy as it is before
the update, with the same sampler seed every pass, so that passes differ by the policy and not by the prompts
or the draw. Its ceiling is log ``num_seeds`` whatever the batch's size: 16 × 4 gives 64 rows over 16 prompts
where a batch of 4 groups gives 4 prompts. The DataModule samples them (``SamplesFirstTurns``); they are
neither trained on nor written to the rollouts JSONL.

Several processes (DDP/FSDP): each rank rolls out its own share of the iteration's episodes. The pass
all-gathers every rank's turns (``gather_trajectories``), so every rank draws the same rows with the same
seed, runs the same forwards (FSDP needs every rank in every forward) and logs identical numbers. The
held-out instances are shared out among the ranks the same way and gathered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L

from ragen2.data.batch import RolloutBatch
from ragen2.data.contracts import RendersPrompts, first_turn_source, held_policy, prompt_source
from ragen2.data.evaluation import heldout_seeds
from ragen2.diagnostics.findings import held_findings
from ragen2.diagnostics.metric import MIMetric
from ragen2.diagnostics.mi_pass import Grammar, MIPass, measure_pass
from ragen2.diagnostics.sampling import MODES, Trajectory, gather_trajectories, trajectories
from ragen2.distributed import Ranks
from ragen2.errors import ConfigError
from ragen2.settings import settings


def _budgets(num_samples: int | Mapping[str, int], modes: Sequence[str]) -> dict[str, int]:
    if isinstance(num_samples, Mapping):
        unknown = sorted(set(num_samples) - set(MODES))
        missing = [m for m in modes if m not in num_samples]
        if unknown or missing:
            raise ConfigError(
                f"diagnostics.num_samples={dict(num_samples)} "
                + (f"names unknown modes {unknown}" if unknown else f"has no budget for modes {missing}")
                + f". Fix: give one int for every mode, or one per mode in diagnostics.modes={list(modes)}"
            )
        budgets = {m: num_samples[m] for m in modes}
    else:
        budgets = dict.fromkeys(modes, num_samples)
    for mode, n in budgets.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            key = "diagnostics.num_samples" + (f".{mode}" if isinstance(num_samples, Mapping) else "")
            raise ConfigError(f"{key}={n}: MI needs at least two (X, Z) rows to compare. Fix: {key}=64")
    return budgets


#: held-out instances ``info`` may look through for each one it keeps
SCAN_FACTOR = 100


def matching_seeds(
    run_seed: int, n: int, info: Mapping[str, Any] | None, source: RendersPrompts | None, key: str
) -> list[int]:
    """The first ``n`` held-out instance seeds whose reset info holds ``info`` (all of them without ``info``),
    read from ``source``'s first prompts; every rank reads the same. ``key`` names the setting in errors."""
    if not info:
        return heldout_seeds(run_seed, n)
    if source is None:
        raise ConfigError(
            f"{key}.info={dict(info)} reads each instance's reset info, which this run's data module does not "
            f"render. Fix: {key}.info=null"
        )
    candidates = heldout_seeds(run_seed, n * SCAN_FACTOR)
    kept: list[int] = []
    for start in range(0, len(candidates), n):
        chunk = candidates[start : start + n]
        for seed, (_, reset) in zip(chunk, source.first_prompts(chunk)):
            if all(reset.get(k) == v for k, v in info.items()) and len(kept) < n:
                kept.append(seed)
        if len(kept) == n:
            return kept
    raise ConfigError(
        f"{key}.info={dict(info)}: only {len(kept)} of the first {len(candidates)} held-out instances match, "
        f"fewer than the {n} asked for. Fix: values the env's reset info takes (TwoHop: {{kind: learnable}}), or "
        "fewer instances"
    )


@dataclass(frozen=True)
class Exact:
    """``diagnostics.exact``: the exact figures (``diag/exact/*``) over held-out instances' prompts, for an env
    whose reasoning has a grammar (``TextEnv.reasoning_grammar``)."""

    num_prompts: int = 64
    """Held-out instances whose first prompts are scored: the first of validation's that match ``info``."""
    info: dict[str, Any] | None = None
    """Keep only instances whose reset info holds these values (TwoHop: ``{kind: learnable}``); null: any."""

    def __post_init__(self) -> None:
        if self.num_prompts < 2:
            raise ConfigError(
                f"diagnostics.exact.num_prompts={self.num_prompts}: I(X;Z) compares prompts, so it needs at least "
                "2. Fix: diagnostics.exact.num_prompts=64"
            )


@dataclass(frozen=True)
class HeldOut:
    """``diagnostics.heldout``: the ``heldout`` curve's instances and first-turn samples per instance."""

    num_seeds: int = 0
    """Held-out instances scored at every MI pass (the first of validation's): the curve's columns, its ceiling
    log ``num_seeds``. 0: no ``heldout`` curve."""
    samples: int = 4
    """First turns sampled per instance at every pass, the same sampler seed every pass."""
    info: dict[str, Any] | None = None
    """Keep only instances whose reset ``info`` holds these values (TwoHop's ``{kind: learnable}``): the first
    ``num_seeds`` of validation's that match. null: the first ``num_seeds``, whatever they are."""

    def __post_init__(self) -> None:
        if self.num_seeds < 0 or self.num_seeds == 1:
            raise ConfigError(
                f"diagnostics.heldout.num_seeds={self.num_seeds}: MI compares prompts, so it needs 0 (no "
                "heldout curve) or at least 2. Fix: diagnostics.heldout.num_seeds=16"
            )
        if self.samples < 1:
            raise ConfigError(
                f"diagnostics.heldout.samples={self.samples} must be ≥ 1 first turn per instance. "
                "Fix: diagnostics.heldout.samples=4"
            )

    def all_seeds(self, run_seed: int, source: RendersPrompts | None) -> list[int]:
        """Every rank's held-out instance seeds (``matching_seeds``)."""
        return matching_seeds(run_seed, self.num_seeds, self.info, source, "diagnostics.heldout")

    def seeds(self, every: list[int], ranks: Ranks) -> list[int]:
        """This rank's share of the held-out instance seeds ``every`` (rank-major order once gathered)."""
        share = -(-len(every) // ranks.world)
        return every[ranks.rank * share : (ranks.rank + 1) * share]


class MIDiagnostics(L.Callback):
    """MI proxies of the unfiltered batch under the policy as it sampled, one curve per sampling mode."""

    def __init__(
        self,
        enabled: bool = True,
        every_n_iterations: int = 5,
        num_samples: int | Mapping[str, int] = 64,
        seed: int = 0,
        modes: Sequence[str] = ("first_turn",),
        heldout: HeldOut | Mapping[str, Any] | None = None,
        columns: Sequence[int] = (),
        exact: Exact | Mapping[str, Any] | None = None,
    ) -> None:
        if every_n_iterations < 0:
            raise ConfigError(
                f"diagnostics.every_n_iterations={every_n_iterations} must be ≥ 0 (0 = never). "
                "Fix: diagnostics.every_n_iterations=5"
            )
        if (
            isinstance(modes, str)
            or not modes
            or any(m not in MODES for m in modes)
            or len(set(modes)) != len(modes)
        ):
            raise ConfigError(
                f"diagnostics.modes={modes if isinstance(modes, str) else list(modes)} must be a non-empty "
                f"list of distinct modes from {list(MODES)}. Fix: diagnostics.modes=[first_turn,trajectory,per_turn]"
            )
        self.enabled = enabled
        self.every_n_iterations = every_n_iterations
        self.modes = tuple(str(m) for m in modes)
        self.budgets = _budgets(num_samples, self.modes)
        self.seed = seed
        self.heldout = settings(HeldOut, heldout or {}, "diagnostics.heldout")
        if isinstance(columns, str) or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 2 for n in columns
        ):
            raise ConfigError(
                f"diagnostics.columns={columns!r} must be a list of prompt counts ≥ 2 (each curve's proxies over its "
                "first n prompts, as diag/<curve>_c<n>/*). Fix: diagnostics.columns=[4,16], or [] for none"
            )
        self.columns = tuple(sorted(set(columns)))
        self.exact = None if exact is None else settings(Exact, exact, "diagnostics.exact")
        self._heldout: list[int] | None = None  # the held-out seeds, read once
        self._grammar: Grammar | None = None  # the exact figures' prompts and sentences, read once
        # one metric (one EMA) per curve; turn_<t> metrics appear when a batch first reaches turn t
        self.metrics: dict[str, MIMetric] = {m: MIMetric() for m in self.modes if m != "per_turn"}

    def due(self, iteration: int) -> bool:
        every = self.every_n_iterations
        return self.enabled and every > 0 and iteration % every == 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """With ``exact``: refuse, before the first iteration, an env whose reasoning has no grammar (and read
        its prompts and sentences once)."""
        if self.exact is not None and self.enabled:
            self.grammar(prompt_source(getattr(trainer, "datamodule", None)))

    def heldout_seeds(self, source: RendersPrompts | None) -> list[int]:
        """Every rank's held-out instance seeds (``HeldOut.all_seeds``), read once."""
        if self._heldout is None:
            self._heldout = self.heldout.all_seeds(self.seed, source)
        return self._heldout

    def grammar(self, source: RendersPrompts | None) -> Grammar:
        """The exact figures' input: the held-out instances' first prompts and the grammar's sentences."""
        assert self.exact is not None
        if self._grammar is None:
            sentences = None if source is None else source.grammar_ids()
            if source is None or sentences is None:
                raise ConfigError(
                    "diagnostics.exact enumerates the reasoning grammar of an env that holds its reasoning to one "
                    "(TextEnv.reasoning_grammar), and this run's env has none. Fix: env=twohop, or "
                    "diagnostics.exact=null"
                )
            seeds = matching_seeds(
                self.seed, self.exact.num_prompts, self.exact.info, source, "diagnostics.exact"
            )
            prompts = [ids for ids, _ in source.first_prompts(seeds)]
            self._grammar = Grammar(prompts, sentences)
        return self._grammar

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        policy, findings = held_policy(pl_module), held_findings(pl_module)
        if (
            isinstance(batch, RolloutBatch)
            and policy is not None
            and findings is not None
            and self.due(batch.iteration)
        ):
            findings.mi = self.measure(policy, batch, getattr(trainer, "datamodule", None))

    def measure(self, policy: Any, batch: RolloutBatch, datamodule: Any = None) -> MIPass:
        """The pass on one batch (also callable from a notebook); ``datamodule`` (the run's) samples the
        held-out first turns when ``diagnostics.heldout`` asks for them (``SamplesFirstTurns``) and renders
        their prompts and the grammar for ``diagnostics.exact`` (``RendersPrompts``).

        A collective under ``torch.distributed``: every rank calls it with its own batch.
        """
        ranks = Ranks.current()
        gathered = gather_trajectories(trajectories(batch.episodes), ranks)
        heldout: list[Trajectory] = []
        sampler, prompts = first_turn_source(datamodule), prompt_source(datamodule)
        if self.heldout.num_seeds and sampler is not None:
            seeds = self.heldout.seeds(self.heldout_seeds(prompts), ranks)
            local = trajectories(sampler.first_turns(seeds, self.heldout.samples, self.seed))
            heldout = gather_trajectories(local, ranks)
        grammar = self.grammar(prompts) if self.exact is not None else None
        return self.measure_trajectories(policy, gathered, batch.iteration, heldout, grammar)

    def measure_trajectories(
        self,
        policy: Any,
        trajs: Sequence[Trajectory],
        iteration: int,
        heldout: Sequence[Trajectory] = (),
        grammar: Grammar | None = None,
    ) -> MIPass:
        """The pass on already gathered trajectories: identical inputs give identical numbers and forwards."""
        return measure_pass(
            policy,
            trajs,
            iteration,
            self.modes,
            self.budgets,
            self.seed,
            self.metrics,
            heldout,
            self.columns,
            grammar,
        )

    def state_dict(self) -> dict[str, Any]:
        return {curve: metric.get_extra_state() for curve, metric in self.metrics.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # a checkpoint from before the other modes holds only "first_turn"; curves it lacks start fresh
        for curve, state in state_dict.items():
            self.metrics.setdefault(curve, MIMetric()).set_extra_state(state)
