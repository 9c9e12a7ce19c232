"""The critic component: values aligned with the sampled tokens, zero at start, its own optimizer group."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from ragen2.config import build, compose
from ragen2.errors import ConfigError
from ragen2.models.value import position_values
from ragen2.modules import Critic, OutcomeAdvantage, PolicyModule
from ragen2.modules.estimators import GAEAdvantage


def test_position_values_read_the_state_before_each_sampled_token() -> None:
    head = torch.nn.Linear(3, 1)
    hidden = torch.randn(1, 5, 3, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0]])
    v = position_values(head, hidden, mask)
    # token 2 is sampled from the state at position 1, token 3 from position 2
    with torch.no_grad():
        want = head(hidden[0, 1:3]).squeeze(-1)
    assert torch.allclose(v[0, 2:4], want) and v[0, [0, 1, 4]].abs().sum() == 0


def test_value_head_critic_starts_at_zero_on_the_policy_hidden(tiny_model) -> None:
    critic = Critic()
    critic.build(tiny_model)
    ids = torch.tensor([[5, 6, 7, 8]])
    hidden = tiny_model.get_decoder()(input_ids=ids).last_hidden_state
    v = critic(hidden, ids, torch.ones_like(ids), torch.tensor([[0.0, 1.0, 1.0, 1.0]]))
    assert v.shape == (1, 4) and torch.equal(v, torch.zeros(1, 4))
    assert [n for n, _ in critic.named_parameters()] == ["head.weight", "head.bias"]


def test_separate_critic_has_its_own_trunk_without_lm_head(tiny_model) -> None:
    critic = Critic(trunk="tiny")
    critic.build(tiny_model)
    names = [n for n, _ in critic.named_parameters()]
    assert any(n.startswith("trunk.layers.") for n in names) and not any("lm_head" in n for n in names)
    assert names[-2:] == ["head.weight", "head.bias"]  # trunk first: the optimizer state's order
    ids = torch.tensor([[5, 6, 7, 8]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    v = critic(torch.zeros(1, 4, 1), ids, torch.ones_like(ids), mask)  # the policy's hidden is not used
    v.sum().backward()
    assert critic.head.weight.grad is not None and critic.head.weight.grad.abs().sum() > 0
    # its trunk is a copy: training it cannot move the policy's weights
    p = next(critic.trunk.parameters())
    assert p.data_ptr() != next(tiny_model.get_decoder().parameters()).data_ptr()


def test_warmup_and_settings_are_checked() -> None:
    critic = Critic(warmup_iterations=2)
    assert [critic.trains_policy(i) for i in range(4)] == [False, False, True, True]
    for key, bad in (("lr", 0.0), ("vf_coef", 0.0), ("value_clip", -1.0), ("warmup_iterations", -1)):
        with pytest.raises(ConfigError, match=f"algo.critic.{key}="):
            Critic(**{key: bad})


def test_the_module_refuses_an_estimator_of_the_other_kind(tmp_path: Path) -> None:
    ppo = compose(["model=tiny", "algo=ppo"], run_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="does not use a critic"):
        build(ppo.module, algo={"advantage": OutcomeAdvantage(torch.neg)})
    grpo = compose(["model=tiny", "algo=grpo"], run_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="algo=ppo"):
        build(grpo.module, algo={"advantage": GAEAdvantage()})
    with pytest.raises(ConfigError, match="algo.loss_agg='token-sum'"):
        build(grpo.module, algo={"loss_agg": "token-sum"})


def test_ppo_optimizer_has_a_critic_group_with_its_own_lr(tmp_path: Path) -> None:
    cfg = compose(["model=tiny", "algo=ppo", "algo.critic.lr=3e-5"], run_dir=str(tmp_path))
    module = instantiate(cfg.module)
    assert type(module) is PolicyModule and isinstance(
        module.critic, Critic
    )  # PPO is configured, not a subclass
    module.configure_model()
    groups = module.configure_optimizers()["optimizer"].param_groups
    assert [g["name"] for g in groups] == ["policy", "critic"]
    assert groups[0]["lr"] == cfg.algo.optim.lr and groups[1]["lr"] == 3e-5
    head = {id(p) for p in module.critic.parameters()}
    assert {id(p) for p in groups[1]["params"]} == head  # shared trunk: the critic group is the head only
    assert not head & {id(p) for p in groups[0]["params"]}
    assert type(instantiate(compose(["model=tiny"], run_dir=str(tmp_path)).module).critic) is type(None)
