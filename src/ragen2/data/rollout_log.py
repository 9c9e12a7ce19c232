"""``rollouts.rank<r>.jsonl`` (``rollout.save_jsonl``): every episode a rank sampled, one JSON record a line.

Each record is the episode's own (``Episode.to_record``) with its iteration, its round (DAPO's dynamic
sampling rolls out several), whether the update trains on it (``kept``) and, given the tokenizer, the
trajectory as OpenAI chat ``messages`` (``record_messages``: what other tools read; the token ids stay the
record's own, what ragen2 scores). A resumed (requeued) run redoes
the iteration it was cut off in: the first write of a run drops the records of that iteration and later
ones, so that each iteration is in the file once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragen2.agent.episode import Episode, record_messages

__all__ = ["RolloutLog"]


class RolloutLog:
    """Appends each iteration's sampled episodes to one rank's JSONL file."""

    def __init__(self, path: Path, tokenizer: Any = None) -> None:
        self.path = path
        self.tokenizer = tokenizer  # None: records without their chat messages
        self._trimmed = False  # the file cut back to before this run's first iteration

    def write(
        self, iteration: int, rounds: Sequence[Sequence[Episode]], trained: Sequence[Sequence[bool]]
    ) -> None:
        """Every episode of every round, ``trained`` (per round, per episode) marking those the update
        trains on."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self._trimmed and self.path.is_file():
            lines = self.path.read_text().splitlines()
            before = [line for line in lines if json.loads(line)["iteration"] < iteration]
            self.path.write_text("".join(f"{line}\n" for line in before))
        self._trimmed = True
        with self.path.open("a") as f:
            for r, (episodes, kept) in enumerate(zip(rounds, trained, strict=True)):
                for ep, k in zip(episodes, kept, strict=True):
                    record = {"iteration": iteration, "round": r, "kept": k, **ep.to_record()}
                    if self.tokenizer is not None:
                        record["messages"] = record_messages(record, self.tokenizer)
                    f.write(json.dumps(record) + "\n")
