"""ragen2-warmstart: compose the config, check it, build the demonstrations, fine-tune, save an HF folder.

    ragen2-warmstart env=frozenlake env.kwargs.size=3 env.kwargs.observation=coord
    ragen2-train model.name_or_path=outputs/<run>/model env=frozenlake env.kwargs.size=3 env.kwargs.observation=coord

Every refusal (an env without a solver that explains its moves, an empty demonstration set, a turn format
the agent loop does not read back, a tokenizer that does not survive saving) comes before the model loads.
So does the output guard's (``ragen2.outputs``), before the demonstrations: an ``output`` that holds files
(an earlier warm start's model) unless ``overwrite=true``; one that is, holds or lies in a training run's
folder, or holds ``model.name_or_path`` or ``run_dir``, always. The folder is built beside ``output`` and
swapped in once whole.
"""

from __future__ import annotations

from ragen2._env import set_defaults

set_defaults()

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from omegaconf import DictConfig, OmegaConf  # noqa: E402

from ragen2.cli import hydra_program  # noqa: E402
from ragen2.config import Checked, build, check_seed_and_cap, check_top_level  # noqa: E402
from ragen2.lifecycle.folder import check_writable, claim  # noqa: E402
from ragen2.log import log, quiet_lightning  # noqa: E402
from ragen2.outputs import Output, check_output, replacing_folder  # noqa: E402
from ragen2.settings import check_target_types, check_type, settings  # noqa: E402


def check(cfg: DictConfig) -> Checked:
    """Refuse settings that cannot work, before anything is built; the ``sft`` and ``model`` it built to check
    them, handed to the module."""
    from ragen2.models.loading import ModelConfig
    from ragen2.modules.sft import SFTConfig

    check_top_level(cfg, "warmstart")
    check_seed_and_cap(cfg)
    sft = settings(SFTConfig, OmegaConf.to_container(cfg.sft, resolve=True), "sft")
    # a folder that loads
    model = settings(ModelConfig, OmegaConf.to_container(cfg.model, resolve=True), "model")
    check_writable([("run_dir", str(cfg.run_dir))])
    check_type("overwrite", cfg.overwrite, bool, False)
    source = Path(str(cfg.model.name_or_path)).expanduser()
    # a hub name is no folder here; the run folder (logs, metrics) must not be swapped away with the model
    inputs = {"model.name_or_path": source if source.exists() else None, "run_dir": str(cfg.run_dir)}
    check_output(Output.model("output", Path(str(cfg.output))), inputs, cfg.overwrite)
    check_target_types(cfg)
    return Checked({"sft": sft, "model": model})


def run(cfg: DictConfig) -> dict[str, Any]:
    """Warm-start with a composed config; returns what ``<output>/warmstart.json`` records."""
    checked = check(cfg)
    quiet_lightning()
    # one program at a time in the run folder and where the model lands; then Hydra's record
    with claim([cfg.run_dir, Path(str(cfg.output)).expanduser().parent], "ragen2-warmstart", cfg):
        return _warmstart(cfg, checked)


def _warmstart(cfg: DictConfig, checked: Checked) -> dict[str, Any]:
    import json
    import time
    from dataclasses import asdict

    import lightning as L

    from ragen2.data.demos import describe, reply_tokens
    from ragen2.loggers import finish as finish_loggers

    L.seed_everything(cfg.seed, workers=True)
    start = time.perf_counter()
    datamodule = build(cfg.data)
    datamodule.setup()  # the demonstrations and every check on them, before the model loads
    demos = datamodule.episodes
    log.info("%d demonstrations on %s, %d reply tokens", len(demos), datamodule.env.id, reply_tokens(demos))
    log.info("the first: %s", describe(demos[0]))
    module = checked.handed(cfg.module)
    loggers = [build(c) for c in (cfg.get("logger") or {}).values() if c is not None]
    trainer = build(cfg.trainer, logger=loggers)
    trainer.fit(module, datamodule=datamodule)
    finish_loggers(loggers)
    folder = Path(cfg.output)
    record = {
        "folder": str(folder),
        "model": module.model_cfg.name_or_path,
        "env": asdict(datamodule.env),
        "rollout": datamodule.rollout_cfg.saved(),
        "max_turns_cap": cfg.get("max_turns_cap"),
        "demos": asdict(datamodule.demos),
        "sft": asdict(module.sft),
        "seed": cfg.seed,
        "demonstrations": len(demos),
        "reply_tokens": reply_tokens(demos),
        "loss_first": module.losses[0],
        "loss_last": module.losses[-1],
        "seconds": time.perf_counter() - start,
    }
    if trainer.is_global_zero:
        with replacing_folder(folder) as staged:
            module.save(staged, datamodule.tokenizer)
            (staged / "warmstart.json").write_text(json.dumps(record, indent=2))
        log.info(
            "warm start: loss %.4f -> %.4f, saved to %s", record["loss_first"], record["loss_last"], folder
        )
    return record


main = hydra_program("ragen2-warmstart", "warmstart", run)


if __name__ == "__main__":
    main()
