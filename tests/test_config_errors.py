"""Bad config values fail at start-up, before any model loads, naming the key, the value and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers
from hydra.errors import HydraException

from ragen2.config import compose
from ragen2.train import run

# (overrides, what the error must say: the key with its value, then the fix or the choices)
BAD = [
    (["rollout.groups=0"], r"rollout\.groups=0 .*Fix"),
    (["rollout.group_size=1"], r"rollout\.group_size=1.*Fix: rollout\.group_size=4"),
    (["rollout.max_new_tokens=0"], r"rollout\.max_new_tokens=0 .*Fix"),
    (["rollout.temperature=-1"], r"rollout\.temperature=-1.*Fix"),
    (["rollout.top_p=1.5"], r"rollout\.top_p=1\.5 .*Fix"),
    (["rollout.top_k=-1"], r"rollout\.top_k=-1 .*Fix"),
    (["rollout.max_context=32"], r"rollout\.max_context=32 .*Fix: raise rollout\.max_context"),
    (["rollout.format_penalty=0.5"], r"rollout\.format_penalty=0\.5 .*Fix"),
    (["filter.value=1.5"], r"filter\.value=1\.5: top_p .*\(0, 1\].*Fix"),
    (["filter.value=0"], r"filter\.value=0.*Fix"),
    (["filter.score=rv"], r"filter\.score='rv' is unknown\. Fix: choose one of reward_std"),
    (["filter.strategy=topp"], r"filter\.strategy 'topp'.*choose one of"),
    (["filter.mode=exp"], r"filter\.mode 'exp'.*choose one of"),
    (
        ["filter=rv_quartile", "filter.value=5"],
        r"filter\.value=5: quantile .*filter\.bands=4, .*to 4\. Fix: filter\.value=1",
    ),
    (["filter=rv_quartile", "filter.bands=0"], r"filter\.bands=0: quantile .*Fix: filter\.bands=4"),
    (
        ["filter=trajectory", "filter.trajectory_fraction=1.5"],
        r"filter\.trajectory_fraction=1\.5: .*\(0, 1\].*Fix: filter\.trajectory_fraction=0\.5",
    ),
    (
        ["filter.score=entropy", "rollout=scripted"],
        r"filter\.score='entropy'.*ScriptedSampler.*Fix: rollout=hf",
    ),
    (["filter.loss_scaling=linear"], r"filter\.loss_scaling has moved: set algo\.loss_scaling instead"),
    (
        ["filter.max_empty_iterations=3"],
        r"filter\.max_empty_iterations has moved: set algo\.max_empty_iterations",
    ),
    (
        ["algo.mini_batch_size=32"],
        r"algo\.mini_batch_size=32 exceeds .* 16 episodes.*Fix: algo\.mini_batch_size ≤ 16",
    ),
    (["algo.mini_batch_size=0"], r"algo\.mini_batch_size=0 is out of range\. Fix"),
    (["algo.epochs=0"], r"algo\.epochs=0 is out of range\. Fix"),
    (["algo.max_tokens_per_micro_batch=0"], r"algo\.max_tokens_per_micro_batch=0 .*Fix"),
    (["algo.loss_agg=mean"], r"agg='mean' \(algo\.loss_agg\)\. Fix: choose one of"),
    (["algo.kl_kind=k9"], r"algo\.kl_kind='k9' is unknown\. Fix"),
    (["algo.loss_scaling=quadratic"], r"algo\.loss_scaling='quadratic' is unknown\. Fix: .*sqrt"),
    (["algo.max_empty_iterations=-1"], r"algo\.max_empty_iterations=-1 .*Fix"),
    (["algo.optim.lr=-1"], r"algo\.optim\.lr=-1.*Fix: algo\.optim\.lr="),
    (["algo.optim.betas=[0.9,1.5]"], r"algo\.optim\.betas=\[0\.9, 1\.5\].*Fix"),
    (["algo.policy_loss.fn.clip_low=1.5"], r"algo\.policy_loss\.fn: clip_low=1\.5 .*Fix"),
    (["algo.policy_loss.fn.dual_clip=0.5"], r"algo\.policy_loss\.fn: dual_clip=0\.5 .*Fix"),
    (["algo=ppo", "algo.critic.lr=-1"], r"algo\.critic\.lr=-1.*Fix"),
    (["algo=ppo", "algo.critic.vf_coef=0"], r"algo\.critic\.vf_coef=0.*Fix"),
    (["algo=ppo", "algo.advantage.gamma=1.5"], r"algo\.advantage\.gamma=1\.5 .*Fix"),
    (
        ["algo=ppo", "algo.advantage.bilevel=true", "algo.advantage.reward=episode"],
        r"algo\.advantage\.reward='episode'.*Fix",
    ),
    (
        ["algo=reinforce_pp", "algo.advantage.reward=turns"],
        r"algo\.advantage\.reward='turns' is unknown\. Fix",
    ),
    (
        ["algo=ppo", "algo.critic_warmup_iterations=2"],
        r"has moved: set algo\.critic\.warmup_iterations instead",
    ),
    (
        ["algo=ppo", "algo.critic_optim.lr=1e-4"],
        r"algo\.critic_optim\.lr has moved: set algo\.critic\.lr instead",
    ),
    (["algo=dapo", "algo.sampling.max_rounds=0"], r"algo\.sampling\.max_rounds=0 .*Fix"),
    (["algo=dapo", "algo.shaping.cache_len=-1"], r"algo\.shaping\.cache_len=-1 .*Fix"),
    (
        ["algo/kl_reward=adaptive", "algo.kl_reward.controller.target_kl=0"],
        r"algo\.kl_reward\.controller\.target_kl=0.*Fix",
    ),
    (["algo/kl_reward=fixed", "algo.kl_reward.kind=k7"], r"algo\.kl_reward\.kind='k7' is unknown\. Fix"),
    (["algo/advantage=gae"], r"needs a critic's values, and algo\.critic is null\. Fix: use algo=ppo"),
    (["+algo/critic=separate", "algo=ppo"], r"'\+algo/critic=separate': use algo/critic=<name> without '\+'"),
    (["data.sampling.max_rounds=2"], r"data\.sampling\.max_rounds has moved: set algo\.sampling\.max_rounds"),
    (["env.max_turns=0"], r"env\.max_turns=0 must be ≥ 1\. Fix"),
    (["env.id=ragen2/Chess-v0"], r"env\.id='ragen2/Chess-v0' is not a ragen2 environment\. Fix: env=<name>"),
    (["val.k=8", "val.samples=2"], r"val\.k=8 exceeds val\.samples=2.*Fix: val\.samples=8"),
    (["val.num_seeds=0"], r"val\.num_seeds=0 .*Fix"),
    (["model.dtype=float64"], r"model\.dtype='float64' is not supported\. Fix: one of bfloat16"),
    (["diagnostics.num_samples=1"], r"diagnostics\.num_samples=1: .*Fix"),
    (["diagnostics.every_n_iterations=-1"], r"diagnostics\.every_n_iterations=-1 .*Fix"),
    (["trainer.devices=2"], r"trainer\.devices=2, .*strategy=None.*Fix: trainer=ddp or trainer=fsdp"),
    (["trainer.devices=auto"], r"trainer\.devices='auto'.*Fix: trainer\.devices=1"),
    (["trainer=ddp", "trainer.devices=3"], r"rollout\.groups=4 does not divide among 3 ranks.*Fix"),
    (["iterations=0"], r"iterations=0 must be ≥ 1"),
]
# a typo in a group name: Hydra's own error names the group, the value and the options there are
TYPOS = [
    ("algo=grpoo", "algo/grpoo", "gspo"),
    ("filter=top-p", "filter/top-p", "top_p"),
    ("env=sokobn", "env/sokobn", "sokoban"),
]


class ModelLoaded(Exception):
    pass


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any model load fails loudly: the config error must come first."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise ModelLoaded("a model loaded before the config error")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def test_at_least_twenty_bad_values_are_covered() -> None:
    assert len(BAD) + len(TYPOS) >= 20


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_value_fails_at_start_up(
    overrides: list[str], message: str, no_model_loads: None, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=message):
        run(compose(["model=tiny", *overrides], run_dir=str(tmp_path)))
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(("override", "missing", "an_option"), TYPOS, ids=[t[0] for t in TYPOS])
def test_group_name_typo_lists_the_options(override: str, missing: str, an_option: str) -> None:
    with pytest.raises(
        HydraException, match=rf"(?s)Could not find '{missing}'.*Available options.*{an_option}"
    ):
        compose([override])


def test_the_command_line_refuses_a_moved_key(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "ragen2.train", "filter.loss_scaling=linear"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "filter.loss_scaling has moved: set algo.loss_scaling instead" in done.stderr
