"""ragen2-eval: success rate and pass@k of a checkpoint or HF model on held-out seeds, greedy and sampled.

    ragen2-eval checkpoint=outputs/<run>/checkpoints/last.ckpt num_seeds=64 samples=8
    ragen2-eval model.name_or_path=builtin env=frozenlake

With ``checkpoint=``, the env, model and rollout settings are the ones the run trained with (saved in the
checkpoint: the turn limit, the token limit, the temperature, …); the command line still overrides any of
them (``env=sokoban``, ``env.max_turns=5``).
"""

from __future__ import annotations

from ragen2._env import set_defaults

set_defaults()

from collections.abc import Sequence  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from ragen2.config import CONF_DIR, command_line, one_line_errors  # noqa: E402
from ragen2.log import log  # noqa: E402


def run(cfg: DictConfig, overrides: Sequence[str] = ()) -> dict[str, float]:
    """Evaluate with a composed eval config; ``overrides`` are the command line's (they beat saved settings)."""
    import json
    from pathlib import Path

    from ragen2.models.checkpoint import load_policy, read_checkpoint, saved_settings

    state = read_checkpoint(cfg.checkpoint) if cfg.checkpoint else None  # a bad file fails before the imports

    from ragen2.config import build, settings, with_saved_settings
    from ragen2.data.evaluation import evaluate, heldout_seeds
    from ragen2.data.rollout_config import EnvConfig, RolloutConfig
    from ragen2.models.loading import ModelConfig, load_tokenizer
    from ragen2.models.placement import Placement

    if state is not None:
        cfg = with_saved_settings(cfg, saved_settings(state, cfg.checkpoint), overrides)
    env = settings(EnvConfig, OmegaConf.to_container(cfg.env, resolve=True), "env")
    rollout = settings(RolloutConfig, build(cfg.rollout, _convert_="all"), "rollout")
    model = settings(ModelConfig, OmegaConf.to_container(cfg.model, resolve=True), "model")
    place = settings(Placement, OmegaConf.to_container(cfg.trainer, resolve=True), "trainer")
    tokenizer = load_tokenizer(model.name_or_path)
    sampler = rollout.sampler(tokenizer)
    policy = load_policy(model.name_or_path, cfg.checkpoint, model.dtype, state)
    sampler.sync_weights(policy.to(place.device()).eval())
    seeds = heldout_seeds(cfg.seed, cfg.num_seeds)
    with place.autocast():
        results = evaluate(
            rollout.runner(env, tokenizer), sampler, seeds, cfg.samples, cfg.ks, oracle=cfg.oracle
        )
    out = Path(cfg.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "env": env.id,
        "max_turns": env.max_turns,
        "model": model.name_or_path,
        "checkpoint": cfg.checkpoint,
        "device": str(place.device()),
        "precision": str(place.precision),
    }
    out.write_text(json.dumps({**record, **results}, indent=2))
    width = max(len(k) for k in results)
    print("\n".join(f"{key:<{width}}  {results[key]:.4f}" for key in sorted(results)))
    log.info("eval results: %s", out)
    return results


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="eval")
@one_line_errors("ragen2-eval")
def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    run(cfg, HydraConfig.get().overrides.task)


def main() -> None:
    command_line("ragen2-eval", _main)


if __name__ == "__main__":
    main()
