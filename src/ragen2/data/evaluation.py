"""Held-out evaluation, one path for ``ragen2-eval`` and for validation during training.

- Seeds: ``heldout_seeds`` draws instances far above every training seed (training uses
  seed·1,000,003 + iteration·groups + …; DAPO's extra rounds start at 2,000,000,011), so no evaluated
  instance was ever trained on.
- Greedy success and return (temperature 0), sampled success and the unbiased pass@k (Chen et al.
  2021) over ``samples`` rollouts per instance at the rollout's own temperature.
- The env solver's success through the same agent protocol (``oracle/success``): the upper bound.
- ``record`` gets one record per seed and phase (greedy, sampled, oracle) as soon as that seed's
  episodes have ended, for ``ragen2-eval`` to write out as they come.
Validation logs the same numbers under ``val/`` (``validation_metrics``, ``validation_rollout``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ragen2.agent.episode import Episode
from ragen2.agent.runner import EpisodeRunner
from ragen2.data.record import RolloutStats
from ragen2.data.rollout_config import ValConfig
from ragen2.rollout.base import Sampler
from ragen2.rollout.scripted import ScriptedSampler

VAL_SEED_OFFSET = 1_000_000_007  # held-out instances never collide with training seeds
ORACLE_RESPONSE = "Following the solver.</think><answer>{oracle}</answer>"


def heldout_seeds(seed: int, n: int) -> list[int]:
    """The ``n`` held-out instance seeds of a run seeded ``seed``."""
    return [VAL_SEED_OFFSET + seed * 10_007 + i for i in range(n)]


def pass_at_k(successes: Sequence[Sequence[bool]], k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021) averaged over instances, each with n ≥ k samples."""
    total = 0.0
    for samples in successes:
        n, c = len(samples), sum(samples)
        if n < k:
            raise ValueError(f"pass@{k} needs at least {k} samples per instance, got {n}; raise val.samples")
        fail = 1.0
        for i in range(n - c + 1, n + 1):  # C(n-c, k) / C(n, k) as a product
            fail *= 1.0 - k / i
        total += 1.0 - (fail if n - c >= k else 0.0)
    return total / max(1, len(successes))


def evaluate(
    runner: EpisodeRunner,
    sampler: Sampler,
    seeds: Sequence[int],
    samples: int,
    ks: Sequence[int],
    sample_seed: int = 0,
    oracle: bool = False,
    record: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, float]:
    """``greedy/*``, ``sampled/*`` rollout metrics, ``pass@k`` (n = ``samples``) and ``oracle/success``;
    ``record`` gets each seed's ``phase``, ``seed``, rollout metrics and ``successes`` as it finishes."""

    def per_seed(phase: str) -> Callable[[list[Episode]], None] | None:
        if record is None:
            return None
        write = record

        def done(episodes: list[Episode]) -> None:
            successes = [ep.success for ep in episodes]
            write(
                {
                    "phase": phase,
                    "seed": episodes[0].seed,
                    **RolloutStats.of(episodes).as_metrics(),
                    "successes": successes,
                }
            )

        return done

    out: dict[str, float] = {"instances": float(len(seeds))}
    greedy_params = replace(runner.params, temperature=0.0)
    greedy = runner.collect(
        sampler,
        seeds,
        1,
        sample_seed=sample_seed,
        params=greedy_params,
        desc="eval greedy",
        group_done=per_seed("greedy"),
    )
    out.update(RolloutStats.of(greedy).as_metrics("greedy/"))
    if samples > 0:
        sampled = runner.collect(
            sampler,
            seeds,
            samples,
            sample_seed=sample_seed + 1,
            desc="eval sampled",
            group_done=per_seed("sampled"),
        )
        out.update(RolloutStats.of(sampled).as_metrics("sampled/"))
        by_seed = [[ep.success for ep in sampled if ep.group == g] for g in range(len(seeds))]
        for k in ks:
            if k <= samples:
                out[f"pass@{k}"] = pass_at_k(by_seed, k)
    if oracle:
        solver = ScriptedSampler(runner.tokenizer, [ORACLE_RESPONSE])
        solved = runner.collect(
            solver,
            seeds,
            1,
            sample_seed=0,
            params=greedy_params,
            desc="eval solver",
            group_done=per_seed("oracle"),
        )
        out["oracle/success"] = sum(ep.success for ep in solved) / len(solved)
    return out


def validation_metrics(results: dict[str, float]) -> dict[str, float]:
    """``evaluate``'s numbers under the ``val/`` keys validation logs."""
    return {
        "val/success": results["greedy/success"],
        "val/return": results["greedy/return"],
        "val/sampled_success": results["sampled/success"],
        **{f"val/{k}": v for k, v in results.items() if k.startswith("pass@")},
    }


def validation_rollout(
    runner: EpisodeRunner, sampler: Sampler, seed: int, val: ValConfig
) -> dict[str, float]:
    """Validation during training: greedy success and sampled pass@k on the held-out seeds of a run seeded
    ``seed`` (``val/*``), and its seconds (``time/validation``)."""
    start = time.perf_counter()
    seeds = heldout_seeds(seed, val.num_seeds)
    results = evaluate(runner, sampler, seeds, val.samples, sorted({1, val.k}), sample_seed=seed)
    return {**validation_metrics(results), "time/validation": time.perf_counter() - start}
