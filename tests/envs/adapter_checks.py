"""What each adapter's test file runs on its own env (tests/envs/adapted.py): test_all_envs' checks of one id,
the conf checks for an id that is not ragen2's own, and scripted episodes through the project's runner.
A module of its own: test_all_envs imports ``adapted`` to leave the adapters' confs out."""

from __future__ import annotations

from functools import partial
from typing import Any

import ragen2_envs
from unit.data import test_env_timeouts

from envs import test_all_envs as contract
from envs.adapted import Adapted
from ragen2.agent import AgentConfig, Episode, EpisodeRunner
from ragen2.config import compose
from ragen2.rollout import SamplingParams
from ragen2.rollout.scripted import ScriptedSampler

#: test_all_envs' checks of one env id, which each adapter's file runs on its own id
ENV_CONTRACT = (
    contract.test_check_env,
    contract.test_reset_is_seeded,
    contract.test_fuzzed_actions_never_raise,
    contract.test_oracle_earns_reward_within_budget,
    contract.test_every_option_default_is_in_its_declared_bounds,
)


def check_config_contract(adapted: Adapted, tokenizer: Any) -> None:
    """test_env_config_shape_and_make and the conf checks, for an id that is not ragen2's own (own_ids)."""
    cfg = compose([f"env={adapted.conf}"]).env
    assert set(cfg) == {
        "id",
        "max_turns",
        "max_actions_per_turn",
        "step_timeout_s",
        "kwargs",
        "tools",
        "tool_format",
    }
    assert isinstance(ragen2_envs.make(cfg.id, **cfg.kwargs), ragen2_envs.TextEnv)
    assert cfg.id not in ragen2_envs.declared_ids()  # ragen2 runs without the package
    contract.test_every_conf_env_kwarg_is_a_declared_option_in_bounds(adapted.path)
    contract.test_turn_limit_is_the_envs_own_capped_by_the_cpu_default(adapted.path, tokenizer)
    test_env_timeouts.test_every_env_config_sets_the_runners_limit(adapted.path, tokenizer)


def collect(
    adapted: Adapted,
    tokenizer: Any,
    responses: list[str],
    seeds: list[int],
    group_size: int,
    max_turns: int,
    **env_kw: Any,
) -> list[Episode]:
    """Episodes of the adapted env with scripted replies (the project's runner, as training collects)."""
    runner = EpisodeRunner(
        partial(ragen2_envs.make, adapted.env_id, **env_kw),
        tokenizer,
        AgentConfig(max_turns=max_turns, max_actions_per_turn=1),
        SamplingParams(max_new_tokens=64),
        env_id=adapted.env_id,
    )
    return runner.collect(ScriptedSampler(tokenizer, responses), seeds, group_size, sample_seed=0)
