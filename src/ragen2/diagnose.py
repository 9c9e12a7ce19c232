"""ragen2-diagnose: the MI family of a model on an env, or of a run's saved rollouts, as a report folder.

    ragen2-diagnose                                                  # built-in model, FrozenLake, N = 8 × K = 4
    ragen2-diagnose model.name_or_path=<hf name or folder> env=sokoban num_seeds=16 samples=8
    ragen2-diagnose rollouts=<run>/rollouts.rank0.jsonl [checkpoint=<run>/checkpoints/last.ckpt] [iteration=3]
    ragen2-diagnose rollouts=<trl output_dir>/completions model.name_or_path=<the model TRL trained>

First turns of N held-out instance seeds × K samples (or the first turns of one step of saved rollouts: ragen2's,
an OpenAI chat messages JSONL, TRL's completions parquet files, verl's rollout dump; ``ragen2.diagnostics.readers``)
are cross-scored under the model and written up by ``ragen2.diagnostics.report``: metrics.json, heatmap.png,
quadrant.png, ranks.png, rows.jsonl and index.md in ``output`` (default: the Hydra run folder), and with rollouts of
several steps the curves over them (curves.json, curves.png).
An ``output`` that cannot be written or holds what is read (the rollouts file, the checkpoint) is refused before
anything loads (``ragen2.outputs``), and so is one that holds a report, unless ``overwrite=true``.
"""

from __future__ import annotations

from ragen2._env import set_defaults

set_defaults()

import functools  # noqa: E402
import os  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from omegaconf import DictConfig  # noqa: E402

from ragen2.cli import hydra_program, job_overrides, task_overrides  # noqa: E402
from ragen2.config import Played, check_top_level, played  # noqa: E402
from ragen2.errors import ConfigError  # noqa: E402
from ragen2.lifecycle.folder import claim  # noqa: E402
from ragen2.log import log  # noqa: E402
from ragen2.outputs import Output, check_output, check_outside  # noqa: E402
from ragen2.settings import check_type  # noqa: E402


def check(
    cfg: DictConfig, overrides: Sequence[str] | None = None
) -> tuple[Any, str | None, int | None, Played]:
    """Refuse settings that cannot work before anything loads; returns the quadrant's splits, the rollouts'
    format (None when sampling), the step (a ragen2 run's iteration) to report on (None: the last) and what
    is played (``played``: the model and, when sampling, the env and rollout, with a checkpoint's settings
    under ``overrides``, the command line's; None: the running Hydra job's)."""
    check_top_level(cfg, "diagnose")
    from ragen2.diagnostics.readers import FORMATS, detect
    from ragen2.diagnostics.report import CURVE_FILES, REPORT_FILES, Splits

    for key, example in (("seed", 0), ("num_seeds", 8), ("samples", 4), ("max_batch_tokens", 512)):
        check_type(key, cfg[key], int, example)
    check_type("iteration", cfg.iteration, int | None, 0)
    check_type("overwrite", cfg.overwrite, bool, False)
    check_type("curves", cfg.curves, bool, True)
    check_type("format", cfg.format, str, "auto")
    if cfg.format not in ("auto", *FORMATS):
        raise ConfigError(
            f"format={cfg.format!r} is not a rollouts format. Fix: format=auto, or one of {FORMATS}"
        )
    if cfg.num_seeds < 2:
        raise ConfigError(
            f"num_seeds={cfg.num_seeds}: MI compares prompts, so it needs at least 2. Fix: num_seeds=8"
        )
    if cfg.samples < 1:
        raise ConfigError(f"samples={cfg.samples} must be ≥ 1 sample per instance. Fix: samples=4")
    if cfg.max_batch_tokens < 1:
        raise ConfigError(f"max_batch_tokens={cfg.max_batch_tokens} must be ≥ 1. Fix: max_batch_tokens=512")
    splits = dict(cfg.splits)
    unknown = set(splits) - {"mi_fraction", "entropy"}
    if unknown:
        raise ConfigError(
            f"splits.{sorted(unknown)[0]} is not a setting. Fix: splits.mi_fraction, splits.entropy"
        )
    try:
        quadrant = Splits(**splits)
    except ValueError as err:
        raise ConfigError(
            f"splits={splits}: {err}. Fix: e.g. splits.mi_fraction=0.1 splits.entropy=0.5"
        ) from None
    report = Output.report("output", Path(str(cfg.output)), (*REPORT_FILES, *CURVE_FILES))
    check_outside("output", report.path, "folder", {"model.name_or_path": str(cfg.model.name_or_path)})
    check_output(report, {"rollouts": cfg.rollouts, "checkpoint": cfg.checkpoint}, cfg.overwrite)
    fmt, iteration = None, None
    if cfg.rollouts is not None:
        fmt = detect(cfg.rollouts) if cfg.format == "auto" else str(cfg.format)
        # a ragen2 file is read whole now; another format as it streams, later (a bad row is refused before
        # anything is written)
        iteration = _chosen(str(cfg.rollouts), cfg.iteration) if fmt == "ragen2" else cfg.iteration
    play = played(cfg, job_overrides() if overrides is None else overrides, samples=cfg.rollouts is None)
    return quadrant, fmt, iteration, play


def _chosen(path: str, iteration: int | None) -> int | None:
    """The step a ragen2 rollouts file is reported on, read whole now: a bad file is refused before the model
    loads. The settings check and the run both ask, so an unchanged file is read once."""
    try:
        stat = os.stat(path)
    except OSError:  # read_jsonl names the missing file
        return _read_chosen(path, iteration, None)
    return _read_chosen(path, iteration, (stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=4)
def _read_chosen(path: str, iteration: int | None, version: tuple[int, int] | None) -> int | None:
    from ragen2.diagnostics.report import chosen_iteration, read_jsonl

    return chosen_iteration(read_jsonl(path), iteration, path)


def run(cfg: DictConfig, overrides: Sequence[str] = ()) -> Any:
    """Diagnose with a composed diagnose config; returns the ``Diagnosis`` (its report is written)."""
    from ragen2.models.checkpoint import read_checkpoint

    splits, fmt, iteration, play = check(cfg, overrides)
    state = read_checkpoint(cfg.checkpoint) if cfg.checkpoint else None
    report = Path(str(cfg.output)).expanduser()
    with claim(report.parent, "ragen2-diagnose", cfg):  # one program in the folder at a time; then the record
        return _diagnose(play, splits, fmt, iteration, state)


def _diagnose(
    play: Played, splits: Any, fmt: str | None, iteration: int | None, state: dict[str, Any] | None
) -> Any:
    import time

    from ragen2.data.evaluation import heldout_seeds
    from ragen2.diagnostics.report import diagnose, rows_from_episodes, write_report
    from ragen2.models.checkpoint import load_policy
    from ragen2.models.loading import load_tokenizer
    from ragen2.rollout.first_turn import sample_first_turns

    cfg, model, place = play.cfg, play.model, play.place
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    tokenizer = load_tokenizer(model.name_or_path)
    policy = load_policy(model.name_or_path, cfg.checkpoint, model.dtype, state).to(place.device()).eval()
    seconds["load"] = time.perf_counter() - start

    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False)  # as the runner decodes

    start = time.perf_counter()
    if fmt is not None:
        with place.autocast():
            diag = _score_steps(cfg, policy, tokenizer, fmt, iteration, splits, seconds)
        seconds["read"] = time.perf_counter() - start - seconds["cross-scoring"]
    else:
        env, rollout = play.env, play.rollout
        assert env is not None and rollout is not None, "sampling: played() built the env and rollout"
        sampler = rollout.sampler(tokenizer)
        sampler.sync_weights(policy)
        seeds = heldout_seeds(cfg.seed, cfg.num_seeds)
        with place.autocast():
            episodes = sample_first_turns(
                rollout.runner(env, tokenizer), sampler, seeds, cfg.samples, cfg.seed
            )
        rows = rows_from_episodes(episodes, decode)
        source = (
            f"{env.id}, {cfg.num_seeds} held-out seeds × {cfg.samples} first-turn samples "
            f"({len(rows)} with a valid Z; temperature {rollout.temperature}, "
            f"max_new_tokens {rollout.max_new_tokens})"
        )
        seconds["rollout"] = time.perf_counter() - start
        start = time.perf_counter()
        with place.autocast():
            diag = diagnose(policy, rows, splits, max_batch_tokens=cfg.max_batch_tokens)
        seconds["cross-scoring"] = time.perf_counter() - start
        diag.info["source"] = source
    diag.info |= {
        "model": model.name_or_path + (f" + {cfg.checkpoint}" if cfg.checkpoint else ""),
        "device": f"{place.device()}, {place.precision}",
        "seconds": seconds,
    }
    folder = write_report(diag, cfg.output, cfg.max_listed)
    m = diag.metrics
    print(
        f"region {diag.info['region']}: H(Z|X) {m['cond_entropy']:.3f} nats/token, "
        f"I(X;Z) {m['mi_est']:.3f} of log C = {m['mi_upper_bound']:.3f}, retrieval {m['retrieval_acc']:.3f} "
        f"(chance {m['retrieval_chance']:.3f}), {int(m['rows'])} rows × {int(m['columns'])} prompts"
    )
    log.info("diagnose report: %s", folder / "index.md")
    return diag


def _score_steps(
    cfg: DictConfig,
    policy: Any,
    tokenizer: Any,
    fmt: str,
    iteration: int | None,
    splits: Any,
    seconds: dict[str, float],
) -> Any:
    """The pass over the rollouts' chosen step (``iteration``, else the last), its curve over every step read
    (``cfg.curves``); one step's rows in memory at a time."""
    import time

    from ragen2.diagnostics.readers import read_steps
    from ragen2.diagnostics.report import curve_point, diagnose, reward_picture

    seconds["cross-scoring"] = 0.0

    def score(step: Any) -> Any:
        prompts = len({row.prompt_ids for row in step.rows})
        if prompts < 2:
            raise ConfigError(
                f"rollouts={cfg.rollouts}, step {step.step}: {len(step.rows)} of {step.read} rows hold a reasoning "
                f"span (<think>…</think> or reasoning_content) over {prompts} distinct prompt(s): MI compares "
                "prompts, so it needs 2. Fix: rollouts whose completions carry their reasoning, or more prompts "
                "(num_seeds)"
            )
        start = time.perf_counter()
        diag = diagnose(policy, step.rows, splits, max_batch_tokens=cfg.max_batch_tokens)
        seconds["cross-scoring"] += time.perf_counter() - start
        diag.metrics |= reward_picture(step.rewards)
        diag.info |= {"step": step.step, "skipped": step.skips.as_dict(), "skipped_rows": step.skips.total}
        return diag

    vocab = policy.get_input_embeddings().num_embeddings
    chosen: tuple[Any, Any] | None = None  # the step reported on, and its pass once scored
    seen: list[int] = []
    curves: list[dict[str, float]] = []
    for step in read_steps(cfg.rollouts, tokenizer, fmt, vocab, cfg.num_seeds, cfg.samples):
        seen.append(step.step)
        # a step too thin to score (fewer than 2 prompts with a reasoning span) has no point on the curves
        diag = score(step) if cfg.curves and len({r.prompt_ids for r in step.rows}) >= 2 else None
        if diag is not None:
            curves.append(curve_point(step.step, diag))
        if iteration is None or step.step == iteration:
            chosen = (step, diag)
    if chosen is None:
        raise ConfigError(
            f"iteration={iteration} is not in rollouts={cfg.rollouts}, which holds steps {sorted(set(seen))}. "
            f"Fix: iteration={seen[-1]}, or iteration=null for the last"
        )
    diag = chosen[1] or score(chosen[0])
    name = "iteration" if fmt == "ragen2" else "step"
    diag.info |= {
        "source": f"`{cfg.rollouts}` ({fmt}), {name} {diag.info['step']}, first turns",
        "curves": curves,
    }
    return diag


main = hydra_program("ragen2-diagnose", "diagnose", lambda cfg: run(cfg, task_overrides()))

if __name__ == "__main__":
    main()
