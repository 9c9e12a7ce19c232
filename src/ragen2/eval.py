"""ragen2-eval: success rate and pass@k of a checkpoint or HF model on held-out seeds, greedy and sampled.

    ragen2-eval checkpoint=outputs/<run>/checkpoints/last.ckpt num_seeds=64 samples=8
    ragen2-eval model.name_or_path=builtin env=frozenlake

With ``checkpoint=``, the env, model and rollout settings are the ones the run trained with (saved in the
checkpoint: the turn limit, the token limit, the temperature, …); the command line still overrides any of
them (``env=sokoban``, ``env.max_turns=5``).

Results are written as they come: ``<output stem>.seeds.jsonl`` (``eval.seeds.jsonl`` beside ``eval.json``)
gets one line per seed and phase (greedy, sampled, oracle) as soon as that seed's episodes have ended, and
``output`` the summary at the end (written atomically: a full disk keeps the earlier file); an interrupted
evaluation keeps every seed it finished. Settings that cannot work (counts, ``ks`` beyond ``samples``, an
``output`` that cannot be written or is the checkpoint, ``ragen2.outputs``) are refused before anything loads,
and so is an ``output`` that holds an earlier evaluation's files, unless ``overwrite=true``.
"""

from __future__ import annotations

from ragen2._env import set_defaults

set_defaults()

import json  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, cast  # noqa: E402

from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: E402

from ragen2.cli import hydra_program, job_overrides, task_overrides  # noqa: E402
from ragen2.config import Played, check_top_level, played  # noqa: E402
from ragen2.errors import ConfigError  # noqa: E402
from ragen2.lifecycle.folder import claim  # noqa: E402
from ragen2.log import log  # noqa: E402
from ragen2.outputs import Output, check_output, check_outside, write_atomic  # noqa: E402
from ragen2.settings import check_type  # noqa: E402


def check(cfg: DictConfig, overrides: Sequence[str] | None = None) -> tuple[Path, Played]:
    """Refuse settings that cannot work before anything loads; returns where the results go and what is
    played (``played``: the env, rollout and model settings with a checkpoint's under ``overrides``, the
    command line's; None: the running Hydra job's)."""
    check_top_level(cfg, "eval")
    check_type("seed", cfg.seed, int, 0)
    check_type("num_seeds", cfg.num_seeds, int, 16)
    if cfg.num_seeds < 1:
        raise ConfigError(f"num_seeds={cfg.num_seeds} must be ≥ 1 held-out seed. Fix: num_seeds=16")
    check_type("samples", cfg.samples, int, 4)
    if cfg.samples < 0:
        raise ConfigError(
            f"samples={cfg.samples} must be ≥ 0 sampled rollouts per seed (0: greedy only). Fix: samples=4"
        )
    given = OmegaConf.to_container(cfg.ks) if isinstance(cfg.ks, ListConfig) else cfg.ks
    check_type("ks", given, list[int], [1, 2, 4])
    ks = cast(list[int], given)
    if any(k < 1 for k in ks):
        raise ConfigError(f"ks={ks}: pass@k needs k ≥ 1. Fix: ks=[1,2,4]")
    beyond = [k for k in ks if k > cfg.samples]
    if cfg.samples and beyond:
        kept = ",".join(str(k) for k in ks if k <= cfg.samples)
        raise ConfigError(
            f"ks={ks} asks for pass@{max(beyond)}, which needs {max(beyond)} sampled rollouts per seed, "
            f"and samples={cfg.samples}. Fix: samples={max(beyond)}, or ks=[{kept}]"
        )
    check_type("oracle", cfg.oracle, bool, True)
    check_type("overwrite", cfg.overwrite, bool, False)
    out = Path(str(cfg.output)).expanduser()
    if out.is_dir():
        raise ConfigError(f"output={out} is a folder. Fix: output={out / 'eval.json'}")
    check_outside("output", out, "file", {"model.name_or_path": str(cfg.model.name_or_path)})
    check_output(Output.file("output", out, records_path(out)), {"checkpoint": cfg.checkpoint}, cfg.overwrite)
    return out, played(cfg, job_overrides() if overrides is None else overrides)


def records_path(out: Path) -> Path:
    """The per-seed results file beside ``out`` (``eval.json`` -> ``eval.seeds.jsonl``)."""
    return out.with_name(f"{out.stem}.seeds.jsonl")


def run(cfg: DictConfig, overrides: Sequence[str] = ()) -> dict[str, float]:
    """Evaluate with a composed eval config; ``overrides`` are the command line's (they beat saved settings)."""
    from ragen2.models.checkpoint import read_checkpoint

    out, play = check(cfg, overrides)
    state = read_checkpoint(cfg.checkpoint) if cfg.checkpoint else None  # a bad file fails before the imports
    with claim(out.parent, "ragen2-eval", cfg):  # one program in the folder at a time; then Hydra's record
        return _evaluate(play, out, state)


def _evaluate(play: Played, out: Path, state: dict[str, Any] | None) -> dict[str, float]:
    from ragen2.data.evaluation import evaluate, heldout_seeds
    from ragen2.models.checkpoint import load_policy
    from ragen2.models.loading import load_tokenizer

    cfg, env, rollout, model, place = play.cfg, play.env, play.rollout, play.model, play.place
    assert env is not None and rollout is not None, "evaluation samples: played() built its env and rollout"
    tokenizer = load_tokenizer(model.name_or_path)
    sampler = rollout.sampler(tokenizer)
    policy = load_policy(model.name_or_path, cfg.checkpoint, model.dtype, state)
    sampler.sync_weights(policy.to(place.device()).eval())
    seeds = heldout_seeds(cfg.seed, cfg.num_seeds)
    about = {
        "env": env.id,
        "max_turns": env.max_turns,
        "model": model.name_or_path,
        "checkpoint": cfg.checkpoint,
        "device": str(place.device()),
        "precision": str(place.precision),
    }
    with records_path(out).open("w") as records, place.autocast():

        def write(record: dict[str, Any]) -> None:
            records.write(json.dumps(record) + "\n")
            records.flush()  # each line reaches the file as its seed finishes, before the next one does

        write({"phase": "run", **about})  # what an interrupted evaluation's lines were measured on
        results = evaluate(
            rollout.runner(env, tokenizer),
            sampler,
            seeds,
            cfg.samples,
            cfg.ks,
            oracle=cfg.oracle,
            record=write,
        )
    write_atomic(out, json.dumps({**about, **results}, indent=2))  # a full disk keeps the earlier file
    width = max(len(k) for k in results)
    print("\n".join(f"{key:<{width}}  {results[key]:.4f}" for key in sorted(results)))
    log.info("eval results: %s (per seed: %s)", out, records.name)
    return results


main = hydra_program("ragen2-eval", "eval", lambda cfg: run(cfg, task_overrides()))

if __name__ == "__main__":
    main()
