"""DemoDataModule: the warm start's demonstrations (``ragen2.data.demos``) as shuffled batches.

``setup`` builds the demonstrations and runs every check on them before a model loads: the env's solver,
the turn format (each reply read back by the agent's parser), an empty set, and the tokenizer saved and
loaded back (``save_pretrained`` into a temporary folder, as the warm start will save it) rendering the
same ids. A batch holds whole episodes, right-padded, and a loss mask over every turn's reply tokens: the
tokens RL trains on (``collate_episodes``). Each pass over the set draws new batches from ``seed``
(``LengthBatches``): episodes of similar length batch together, so a batch pads little, and the batches
come in random order.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import lightning as L
import torch

from ragen2.agent.episode import Episode
from ragen2.data.batch import collate_episodes
from ragen2.data.demos import DemoConfig, check_solver, demonstrate, first_difference
from ragen2.data.rollout_config import EnvConfig, RolloutConfig
from ragen2.errors import ConfigError
from ragen2.models.loading import load_tokenizer
from ragen2.settings import settings


class DemoBatch(NamedTuple):
    """B demonstration episodes, T = the longest."""

    input_ids: torch.Tensor  # [B, T] the episodes' final sequences, right-padded
    attention_mask: torch.Tensor  # [B, T] 1 on real tokens
    loss_mask: torch.Tensor  # [B, T] 1 on every turn's reply tokens (what the solver "sampled")


class _Demonstrations(torch.utils.data.Dataset):
    """The episodes, one item each."""

    def __init__(self, episodes: list[Episode]) -> None:
        self.episodes = episodes

    def __len__(self) -> int:
        return len(self.episodes)

    def __getitem__(self, index: int) -> Episode:
        return self.episodes[index]


class LengthBatches(torch.utils.data.Sampler[list[int]]):
    """Batches of indices, new ones each pass: shuffle, sort each window of ``window`` batches' worth by
    ``lengths``, cut the windows into batches, shuffle the batches. Every index once per pass; a batch's
    rows have similar lengths, so right-padding them wastes little (a multi-turn episode is 2–3 times a
    one-turn one)."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int, window: int = 16) -> None:
        self.lengths, self.batch_size, self.window = lengths, batch_size, window
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        n, span = len(self.lengths), self.batch_size * self.window
        return sum(-(-min(span, n - start) // self.batch_size) for start in range(0, n, span))

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        span = self.batch_size * self.window
        batches = []
        for start in range(0, len(order), span):
            window = sorted(order[start : start + span], key=lambda i: self.lengths[i])
            batches += [window[i : i + self.batch_size] for i in range(0, len(window), self.batch_size)]
        for b in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[b]


class DemoDataModule(L.LightningDataModule):
    """The demonstrations of ``env`` rendered with ``rollout``'s settings (the prompt states the turn and
    token limits, so they must be the RL run's) and ``tokenizer``'s chat template."""

    def __init__(
        self,
        env: EnvConfig | Mapping[str, Any],
        rollout: RolloutConfig | Mapping[str, Any],
        tokenizer: str,
        demos: DemoConfig | Mapping[str, Any] | None = None,
        batch_size: int = 8,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.env = settings(EnvConfig, env, "env")
        self.rollout_cfg = settings(RolloutConfig, rollout, "rollout")
        self.demos = settings(DemoConfig, demos, "demos")
        self.batch_size = batch_size
        self.tokenizer_name = tokenizer
        self.seed = seed
        self.tokenizer: Any = None
        self.episodes: list[Episode] = []

    def setup(self, stage: str | None = None) -> None:
        if self.episodes:
            return
        check_solver(self.env, self.seed)  # before the tokenizer loads
        self.tokenizer = load_tokenizer(self.tokenizer_name)
        runner = self.rollout_cfg.runner(self.env, self.tokenizer)
        self.episodes = demonstrate(runner, self.demos, self.seed)
        with tempfile.TemporaryDirectory() as folder:
            self.tokenizer.save_pretrained(folder)
            reloaded = self.rollout_cfg.runner(self.env, load_tokenizer(folder))
            differs = first_difference(self.episodes, reloaded, self.demos, self.seed)
        if differs is not None:
            seed, at = differs
            raise ConfigError(
                f"model.name_or_path={self.tokenizer_name!r}: its tokenizer, saved and loaded back, renders the "
                f"demonstration of seed {seed} differently from token {at} on, so an RL run that loads the warm "
                "start's folder would see other prompts than the ones trained on. Fix: a model whose tokenizer "
                "and chat template survive save_pretrained"
            )

    def _collate(self, episodes: list[Episode]) -> DemoBatch:
        batch = collate_episodes(episodes, 1, self.tokenizer.pad_token_id)
        return DemoBatch(batch.input_ids, batch.attention_mask, batch.loss_mask)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        lengths = [len(ep.token_ids) for ep in self.episodes]
        return torch.utils.data.DataLoader(
            _Demonstrations(self.episodes),
            batch_sampler=LengthBatches(lengths, self.batch_size, self.seed),
            collate_fn=self._collate,
        )
