"""The ``ragen2`` logger: status lines ("[ragen2] iteration 3: …", the run folder) for terminals and SLURM logs.

Under ``ragen2-train`` Hydra configures logging (console and ``<run>/<job>.log``; conf/hydra/default.yaml
formats records as "[name] message") and the logger's records go there. Anywhere logging is not
configured (a notebook, a test, a script calling ``ragen2.train.run``), it prints to stdout itself, as
Lightning does for its own logger.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("ragen2")
log.setLevel(logging.INFO)


class _UnlessConfigured(logging.StreamHandler):
    """Prints to stdout only while the root logger has no handler of its own (else records propagate)."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.setFormatter(logging.Formatter("[%(name)s] %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            self.stream = sys.stdout  # follow a redirected stdout (pytest's capture, a notebook)
            super().emit(record)


log.addHandler(_UnlessConfigured())
