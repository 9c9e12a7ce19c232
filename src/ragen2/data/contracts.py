"""What the layers above the data layer promise it: the attributes the DataModule and the callbacks read
of the LightningModule. Structural types: a module satisfies them by having the attributes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class HoldsPolicy(Protocol):
    """What the DataModule needs of the module: the causal LM to sample from (synced every iteration)
    and that callbacks score with."""

    policy: Any


class MetricsRow(Protocol):
    """Where a callback puts numbers for the iteration's logged row: the module writes the row to every
    logger once, after every callback's batch-end hook (``PolicyModule.on_train_batch_end``)."""

    row: dict[str, float]


class SamplesFirstTurns(Protocol):
    """What the MI pass's ``heldout`` curve needs of the DataModule: ``samples`` first-turn episodes of each
    instance seed, sampled from the policy as it is now (``RolloutDataModule.first_turns``)."""

    def first_turns(self, seeds: Sequence[int], samples: int, sample_seed: int) -> list[Any]: ...


class RendersPrompts(Protocol):
    """What the held-out instances' selection (``diagnostics.heldout.info``) and the exact figures
    (``diagnostics.exact``) need of the DataModule: instances' first prompts with their reset ``info``, and
    the env's reasoning grammar as ids (``RolloutDataModule.first_prompts``, ``grammar_ids``)."""

    def first_prompts(self, seeds: Sequence[int]) -> list[tuple[list[int], Mapping[str, Any]]]: ...

    def grammar_ids(self) -> list[list[int]] | None: ...


# Read through getattr, not ``isinstance(module, HoldsPolicy)``: from Python 3.12 a runtime protocol check
# looks attributes up statically and misses an nn.Module's submodules (kept in ``_modules``), so a module
# holding its policy would read as not holding one.
def held_policy(module: Any) -> Any:
    """``module.policy`` (``HoldsPolicy``), or None for a module without one."""
    return getattr(module, "policy", None)


def log_row(module: Any, metrics: Mapping[str, float]) -> None:
    """Add ``metrics`` to the module's row (``MetricsRow``), or log them through Lightning for a module
    without one."""
    row = getattr(module, "row", None)
    if isinstance(row, dict):
        row.update(metrics)
    else:
        module.log_dict(dict(metrics), on_step=True, on_epoch=False, batch_size=1)


def first_turn_source(datamodule: Any) -> SamplesFirstTurns | None:
    """``datamodule`` if it samples first turns (``SamplesFirstTurns``), else None."""
    return datamodule if callable(getattr(datamodule, "first_turns", None)) else None


def prompt_source(datamodule: Any) -> RendersPrompts | None:
    """``datamodule`` if it renders first prompts and reads the grammar (``RendersPrompts``), else None."""
    ok = all(callable(getattr(datamodule, name, None)) for name in ("first_prompts", "grammar_ids"))
    return datamodule if ok else None
