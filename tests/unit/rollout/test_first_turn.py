"""First turns only: the wrapped sampler answers turn 1 and ends every later turn, through the real runner;
and the diagnostics report, which reads such rows, imports neither the runner nor a sampler."""

from __future__ import annotations

import ast
from pathlib import Path

from omegaconf import OmegaConf

import ragen2.diagnostics.report as report
from ragen2.config import build, compose
from ragen2.data.rollout_config import EnvConfig, RolloutConfig
from ragen2.rollout import Sampler
from ragen2.rollout.first_turn import FirstTurnSampler, sample_first_turns
from ragen2.rollout.scripted import ScriptedSampler
from ragen2.settings import settings

# two moves that do not reach the goal: an episode that got more turns would go on after turn 1
NOT_DONE = ["plan</think><answer>Left</answer>"]


def test_turn_one_is_the_inner_samplers_and_later_turns_end_at_once(tokenizer) -> None:
    cfg = compose(["model=tiny", "rollout=scripted", "env=frozenlake"])
    env = settings(EnvConfig, OmegaConf.to_container(cfg.env, resolve=True), "env")
    rollout = settings(RolloutConfig, build(cfg.rollout, _convert_="all"), "rollout")
    inner = ScriptedSampler(tokenizer, NOT_DONE)
    assert isinstance(FirstTurnSampler(inner, tokenizer.eos_token_id), Sampler)
    episodes = sample_first_turns(
        rollout.runner(env, tokenizer), inner, seeds=[3, 4], samples=2, sample_seed=0
    )
    assert [(ep.seed, ep.sample) for ep in episodes] == [(3, 0), (3, 1), (4, 0), (4, 1)]
    for ep in episodes:
        first, *later = ep.turns
        assert later  # the episode went on: the move left the agent on the ice
        assert tokenizer.decode(first.sampled_ids) == NOT_DONE[0] and first.format_ok
        # every later turn is the one EOS token the wrapper answers, without a model call
        assert all(t.sampled_ids == [tokenizer.eos_token_id] for t in later)


def test_the_report_imports_neither_the_runner_nor_a_sampler() -> None:
    tree = ast.parse(Path(report.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    assert not {m for m in imported if m.startswith(("ragen2.agent.runner", "ragen2.rollout"))}
