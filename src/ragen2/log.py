"""The ``ragen2`` logger: status lines ("[ragen2] iteration 3: …", the run folder) for terminals and SLURM logs.

Under ``ragen2-train`` Hydra configures logging: the console shows "[package] message" lines
(``ConsoleFormatter``, conf/hydra/default.yaml) and ``<run>/<job>.log`` keeps every record with its time.
Anywhere logging is not configured (a notebook, a test, a script calling ``ragen2.train.run``), the logger
prints to stdout itself, as Lightning does for its own. ``quiet_lightning`` makes Lightning's lines appear
once and drops its adverts and the warnings that are expected here.
"""

from __future__ import annotations

import logging
import sys
import warnings

log = logging.getLogger("ragen2")
log.setLevel(logging.INFO)

# expected here, not actionable: a one-batch IterableDataset with __len__ (one RL iteration per epoch),
# the frozen reference model in eval mode, a resumed run writing last.ckpt into its own folder (no top-k
# state to carry over), and a deprecation inside Lightning itself
EXPECTED_WARNINGS = (
    r"Your `IterableDataset` has `__len__` defined",
    r"Found \d+ module\(s\) in eval mode at the start of training",
    r"The dirpath has changed from",
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # on a machine with SLURM installed, a run outside a job (a login node, a test) is not a mistake:
    # ragen2's grids reach SLURM through submitit, and a job's own runs are detected as such
    r"The `srun` command is available on your system but is not used",
)


class ConsoleFormatter(logging.Formatter):
    """ "[package] message", with the level for warnings and errors: short lines for a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname}: " if record.levelno >= logging.WARNING else ""
        return f"[{record.name.split('.')[0]}] {level}{record.getMessage()}"


class _UnlessConfigured(logging.StreamHandler):
    """Prints to stdout only while the root logger has no handler of its own (else records propagate)."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.setFormatter(ConsoleFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            self.stream = sys.stdout  # follow a redirected stdout (pytest's capture, a notebook)
            super().emit(record)


class _NoAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def quiet_lightning() -> None:
    """Lightning's console lines once (through the configured handlers when there are any), no adverts."""
    import lightning  # noqa: F401  (importing it installs its console handler)

    lightning_log = logging.getLogger("lightning")
    if logging.getLogger().handlers:
        for handler in [h for h in lightning_log.handlers if type(h) is logging.StreamHandler]:
            lightning_log.removeHandler(handler)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoAdverts) for f in rank_zero.filters):
        rank_zero.addFilter(_NoAdverts())
    for message in EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


log.addHandler(_UnlessConfigured())
