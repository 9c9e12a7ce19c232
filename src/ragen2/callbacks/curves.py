"""At the end of training, plot the main curves from the CSV log into ``<run>/curves.png``."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_only

from ragen2.grids import read_series
from ragen2.log import log

MAIN_CURVES = (
    "rollout/success",
    "rollout/return",
    "filter/kept_ratio",
    "diag/first_turn/retrieval_acc",
    "diag/first_turn/mi_est",
    "diag/first_turn/cond_entropy",
    "diag/regime",
    "train/pg_loss",
    "train/entropy",
    "rollout/reasoning_length",
)


def read_metrics(path: Path) -> dict[str, list[tuple[float, float]]]:
    """metrics.csv -> {key: [(iteration, value), …]} (rows without train/iteration are validation rows)."""
    return read_series(path)[0]


def plot_curves(metrics_csv: Path, out_png: Path, keys: tuple[str, ...] = MAIN_CURVES) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = read_metrics(metrics_csv)
    present = [k for k in keys if k in series]
    cols = 3
    rows = max(1, math.ceil(len(present) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, key in zip(axes.flat, present):
        xs, ys = zip(*series[key])
        ax.plot(xs, ys, marker="o")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("iteration")
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


class CurvesPNG(L.Callback):
    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):
                logger.save()
                metrics = Path(logger.log_dir) / "metrics.csv"
                if metrics.is_file():
                    png = plot_curves(metrics, Path(trainer.default_root_dir) / "curves.png")
                    log.info("curves: %s", png)
