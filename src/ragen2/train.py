"""ragen2-train: compose the config, check it, instantiate the DataModule, the module, loggers and callbacks, fit."""

from __future__ import annotations

from ragen2._env import set_defaults

set_defaults()

from omegaconf import DictConfig  # noqa: E402

from ragen2.cli import hydra_program  # noqa: E402
from ragen2.config import build, validate  # noqa: E402
from ragen2.lifecycle.folder import check_run_folder, claim, logger_metrics, write_hydra_record  # noqa: E402
from ragen2.lifecycle.resume import requeue_plugins, run_ckpt_path  # noqa: E402
from ragen2.log import log, quiet_lightning  # noqa: E402


def run(cfg: DictConfig) -> dict[str, float]:
    """Train with a composed config; returns the last iteration's metrics."""
    import gc

    checked = validate(cfg)  # before anything is built or imported (again: a config composed in Python)

    import lightning as L

    from ragen2.lifecycle.checkpoint_fit import (
        check_resume,  # torch and Lightning: not imported for --help, --version
    )
    from ragen2.loggers import finish as finish_loggers

    quiet_lightning()
    check_run_folder(cfg)  # a folder holding another run is continued only when ckpt_path says so
    ckpt_path = run_ckpt_path(
        cfg
    )  # ckpt_path=auto: a requeued SLURM job resumes (ragen2/lifecycle/resume.py)
    if ckpt_path is not None:  # another env, model or critic refused; other changed settings warned
        check_resume(cfg, ckpt_path)
    # one run at a time in the folder, and in a CSV logger's own folder elsewhere
    with claim([cfg.run_dir, *(m.parent for _, m in logger_metrics(cfg))], "ragen2-train"):
        L.seed_everything(cfg.seed, workers=True)
        datamodule = checked.handed(cfg.data)  # with the env, rollout, filter … the checks built
        module = checked.handed(cfg.module)
        write_hydra_record(cfg)  # the run's .hydra/, now that every check has passed
        # a group entry set to null (callbacks.curves=null) switches that piece off
        callbacks = [build(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
        loggers = [build(c) for c in (cfg.get("logger") or {}).values() if c is not None]
        trainer = build(cfg.trainer, callbacks=callbacks, logger=loggers, plugins=requeue_plugins())
        # what start-up made (modules, models, configs: half a million objects) leaves the collector's oldest
        # generation for the run, whose every full collection walked all of it (~0.25 s each, every ~100
        # iterations of the organism); unfrozen after, so that a run's cycles are still freed below
        gc.freeze()
        try:
            # weights-only whatever the strategy: FSDP's ModelParallelStrategy loads with torch.load itself
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        finally:
            gc.unfreeze()
        finish_loggers(loggers)
        if trainer.is_global_zero:
            log.info("run folder: %s", cfg.run_dir)
    metrics, stopped = dict(module.last_metrics), module.stopped
    # the trainer and the module reference each other: free the run's models now, not at the next full
    # collection (several runs in one process, as in a notebook or a benchmark, otherwise pile them up)
    del trainer, module, datamodule, callbacks, loggers
    gc.collect()
    if stopped is not None:  # a run cut short is a failed job: one line, a non-zero status
        raise stopped
    return metrics


main = hydra_program("ragen2-train", "train", run)

if __name__ == "__main__":
    main()
