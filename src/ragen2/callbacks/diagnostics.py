"""MI diagnostics as a callback that owns one torchmetrics Metric per sampling curve (docs/method.md §3).

Before the update of iteration 0 and of every ``every_n_iterations``-th iteration, on the unfiltered
batch, each mode in ``modes`` draws up to its ``num_samples`` budget of (X, Z) rows with a valid Z, the
rows are cross-scored under the policy (``ragen2.diagnostics.cross_score``) and ``MIMetric`` computes
the MI proxies. X is the turn's exact context (``Turn.prompt_ids``: the system prompt and every earlier
turn included), Z its sampled reasoning ids (``Turn.reasoning_ids``).

Modes and the curves they log (``diag/<curve>/*``, each curve with its own EMA state in the checkpoint):

* ``first_turn`` → ``first_turn``: turn 1 of uniformly drawn episodes.
* ``trajectory`` → ``trajectory``: a trajectory drawn uniformly (without replacement), then one of its
  turns with a valid Z, uniformly.
* ``per_turn`` → ``turn_2``, ``turn_3``, …: turn t of uniformly drawn episodes that reached it, one
  curve per turn position, each with the mode's budget (turn 1 is ``first_turn``).

How to read ``columns`` and ``chance``. Columns are the distinct X among the rows scored. On turn 1 the
rollouts of a group share their prompt, so R rows fall into about N = groups columns and retrieval's
chance level is 1/N. After turn 1, X holds each rollout's own history (its earlier reasoning, actions
and observations), so nearly every row is its own column: C ≈ R, chance ≈ 1/R and ``mi_upper_bound``
= log C ≈ log R. Retrieval then asks whether a reasoning picks out *its own trajectory* among all the
others, a finer question than "its own env instance"; compare each curve with its own chance level
(``retrieval_above_chance``, ``mi_zscore_ema``), never the raw accuracy or MI across curves with
different column counts. ``diag/<curve>/rows`` is R, ``valid_rows`` the rows the curve could draw from.

Each pass also leaves ``last_pass`` (``MIPass``): per curve, the three numbers that place it among the
paper's regimes, which ``CollapseMonitor`` reads.

Cost, each pass: ``diag/tokens_processed`` (positions the model ran, all curves),
``diag/token_bound_ratio`` (that over the minimum: Σ over curves of the prefix-tree size of the distinct
X plus C · Σ_r |z_r|; ≈ 1 means no wasted forward) and ``time/diagnostics`` (seconds).

Several processes (DDP/FSDP): each rank rolls out its own share of the iteration's episodes. The pass
all-gathers every rank's turns (``gather_trajectories``), so every rank draws the same rows with the same
seed, runs the same forwards (FSDP needs every rank in every forward) and logs identical numbers.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from ragen2.data.batch import RolloutBatch
from ragen2.data.contracts import held_policy
from ragen2.diagnostics.cross_scoring import CrossScores, cross_score
from ragen2.diagnostics.metric import MIMetric
from ragen2.diagnostics.regimes import PassMetrics
from ragen2.errors import ConfigError

MODES = ("first_turn", "trajectory", "per_turn")

Ids = tuple[int, ...]
Row = tuple[Ids, Ids]  # (X = the turn's prompt ids, Z = its reasoning ids)
Trajectory = tuple[tuple[Ids, Ids | None], ...]  # per turn: (X, Z or None when </think> never came)


@dataclass(frozen=True)
class MIPass:
    """One iteration's MI pass, as the regimes read it: each curve's ``PassMetrics`` (a curve with too few
    distinct contexts, or a non-finite number, is absent)."""

    iteration: int
    curves: dict[str, PassMetrics]


def trajectories(episodes: Sequence[Any]) -> list[Trajectory]:
    """Each episode's turns as (X, Z) id tuples: all the MI pass reads of a batch (and all it gathers)."""
    return [
        tuple((tuple(t.prompt_ids), tuple(t.reasoning_ids) if t.reasoning_ids else None) for t in ep.turns)
        for ep in episodes
    ]


def gather_trajectories(local: list[Trajectory]) -> list[Trajectory]:
    """Every rank's trajectories, in rank order, on every rank; ``local`` itself with one process.

    A collective: under ``torch.distributed`` every rank must call it, as the MI pass does.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local
    shares: list[list[Trajectory] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(shares, local)
    return [traj for share in shares for traj in share or ()]


def _valid(traj: Trajectory, t: int) -> Row | None:
    """Turn ``t`` (0-based) as a row, or None when the episode did not reach it or its Z is invalid."""
    if t >= len(traj):
        return None
    x, z = traj[t]
    return None if z is None else (x, z)


def _draw(rows: list[Row], budget: int, rng: random.Random) -> list[Row]:
    return rng.sample(rows, budget) if len(rows) > budget else rows


def turn_rows(trajs: Sequence[Trajectory], t: int, budget: int, rng: random.Random) -> tuple[list[Row], int]:
    """Turn ``t`` (1-based) of up to ``budget`` uniformly drawn episodes that reached it with a valid Z,
    and how many could be drawn from."""
    candidates = [row for traj in trajs if (row := _valid(traj, t - 1)) is not None]
    return _draw(candidates, budget, rng), len(candidates)


def trajectory_rows(trajs: Sequence[Trajectory], budget: int, rng: random.Random) -> tuple[list[Row], int]:
    """Up to ``budget`` trajectories drawn uniformly without replacement, then one of each one's turns
    with a valid Z, uniformly; a trajectory with no valid Z is not drawn. Also returns the count of
    trajectories that could be drawn."""
    valid = [[row for t in range(len(traj)) if (row := _valid(traj, t)) is not None] for traj in trajs]
    candidates = [rows for rows in valid if rows]
    drawn = rng.sample(candidates, budget) if len(candidates) > budget else candidates
    return [rng.choice(rows) for rows in drawn], len(candidates)


def curves(modes: Sequence[str], trajs: Sequence[Trajectory]) -> list[str]:
    """The curves the modes give on these trajectories: ``turn_<t>`` for every t ≥ 2 some episode reached."""
    out: list[str] = []
    longest = max((len(traj) for traj in trajs), default=0)
    for mode in modes:
        out += [f"turn_{t}" for t in range(2, longest + 1)] if mode == "per_turn" else [mode]
    return out


def mode_of(curve: str) -> str:
    return "per_turn" if curve.startswith("turn_") else curve


def prefix_tree_size(prompts: Sequence[Ids]) -> int:
    """Nodes of the prefix tree of ``prompts``: each distinct prefix token counted once."""
    ordered = sorted(set(prompts))
    size, previous = 0, ()
    for prompt in ordered:
        shared = 0
        for a, b in zip(previous, prompt):
            if a != b:
                break
            shared += 1
        size += len(prompt) - shared
        previous = prompt
    return size


def token_bound(rows: Sequence[Row]) -> int:
    """The fewest positions a cross-scoring of ``rows`` can run: every distinct prefix token of the
    distinct X once, plus every row's |z| under every column (Σ unique prefix + C · Σ_r |z_r|)."""
    prompts = {x for x, _ in rows}
    return prefix_tree_size(list(prompts)) + len(prompts) * sum(len(z) for _, z in rows)


def _bound(scores: CrossScores, rows: Sequence[Row]) -> int:
    """The cross-scorer's own ``token_bound`` when it reports one, else ours from the rows."""
    reported = getattr(scores, "token_bound", None)
    return int(reported) if reported is not None else token_bound(rows)


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


class MIDiagnostics(L.Callback):
    """MI proxies of the unfiltered batch under the policy as it sampled, one curve per sampling mode."""

    def __init__(
        self,
        enabled: bool = True,
        every_n_iterations: int = 5,
        num_samples: int | Mapping[str, int] = 64,
        seed: int = 0,
        modes: Sequence[str] = ("first_turn",),
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
        # one metric (one EMA) per curve; turn_<t> metrics appear when a batch first reaches turn t
        self.metrics: dict[str, MIMetric] = {m: MIMetric() for m in self.modes if m != "per_turn"}
        self.last_pass: MIPass | None = None  # the latest pass (``CollapseMonitor`` reads it)

    def due(self, iteration: int) -> bool:
        every = self.every_n_iterations
        return self.enabled and every > 0 and iteration % every == 0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        policy = held_policy(pl_module)
        if isinstance(batch, RolloutBatch) and policy is not None and self.due(batch.iteration):
            batch.metrics.update(self.measure(policy, batch))

    def measure(self, policy: Any, batch: RolloutBatch) -> dict[str, float]:
        """``diag/<curve>/*`` and the pass's cost of one batch (also callable from a notebook).

        A collective under ``torch.distributed``: every rank calls it with its own batch.
        """
        return self.measure_trajectories(
            policy, gather_trajectories(trajectories(batch.episodes)), batch.iteration
        )

    def _sample(self, curve: str, trajs: Sequence[Trajectory], iteration: int) -> tuple[list[Row], int]:
        budget = self.budgets[mode_of(curve)]
        if curve == "first_turn":
            # the seed the first-turn pass has always used, so its numbers stay those of earlier runs
            return turn_rows(trajs, 1, budget, random.Random(self.seed * 131 + iteration))
        rng = random.Random(f"{self.seed}/{iteration}/{curve}")  # str seeds hash stably (sha512)
        if curve == "trajectory":
            return trajectory_rows(trajs, budget, rng)
        return turn_rows(trajs, int(curve.removeprefix("turn_")), budget, rng)

    def measure_trajectories(
        self,
        policy: Any,
        trajs: Sequence[Trajectory],
        iteration: int,
    ) -> dict[str, float]:
        """The pass on already gathered trajectories: identical inputs give identical numbers and forwards."""
        start = time.perf_counter()
        out: dict[str, float] = {}
        passes: dict[str, PassMetrics] = {}
        processed = bound = 0
        for curve in curves(self.modes, trajs):
            rows, valid = self._sample(curve, trajs, iteration)
            prefix = f"diag/{curve}/"
            out[prefix + "valid_rows"] = float(valid)
            columns = len({x for x, _ in rows})
            if columns < 2:
                continue  # MI needs at least two distinct contexts with a valid Z
            scores = cross_score(policy, rows)
            metric = self.metrics.setdefault(curve, MIMetric())
            metric.update(scores.logp_sum, scores.prompt_index, scores.num_tokens)
            out.update({prefix + k: float(v) for k, v in metric.compute().items()})
            out[prefix + "rows"] = float(len(rows))
            out[prefix + "columns"] = float(columns)
            out[prefix + "chance"] = 1.0 / columns
            if (now := PassMetrics.read(out, curve)) is not None:
                passes[curve] = now
            processed += scores.tokens_processed
            bound += _bound(scores, rows)
        out["diag/tokens_processed"] = float(processed)
        if bound:
            out["diag/token_bound_ratio"] = processed / bound
        out["time/diagnostics"] = time.perf_counter() - start
        self.last_pass = MIPass(iteration, passes)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {curve: metric.get_extra_state() for curve, metric in self.metrics.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # a checkpoint from before the other modes holds only "first_turn"; curves it lacks start fresh
        for curve, state in state_dict.items():
            self.metrics.setdefault(curve, MIMetric()).set_extra_state(state)
