"""Bad config values fail at start-up, before any model loads, naming the key, the value and the fix."""

from __future__ import annotations

import os
import re
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
    (
        ["model/lora=default", "model.lora.rank=0"],
        r"^model\.lora\.rank=0 is out of range: it must be ≥ 1\. Fix",
    ),
    (
        ["model/lora=default", "model.lora.alpha=0"],
        r"^model\.lora\.alpha=0 is out of range: it must be > 0\. Fix",
    ),
    (["model/lora=default", "model.lora.dropout=1.0"], r"^model\.lora\.dropout=1\.0 .*in \[0, 1\)\. Fix"),
    (
        ["model/lora=default", "model.lora.target_modules=[q_proj,qkv_proj]"],
        r"^model\.lora\.target_modules=\[q_proj,qkv_proj\]: 'qkv_proj' matches no module of "
        r"model\.name_or_path='tiny'\. Fix: .*model\.lora\.target_modules=\[down_proj,gate_proj,k_proj,",
    ),
    (
        ["model/lora=default", "model.lora.target_modules=[lm_head]"],
        r"'lm_head' matches lm_head, not one of the decoder's linear layers .*Fix",
    ),
    (
        ["model/lora=default", "model.lora.rank=abc"],
        r"^model\.lora\.rank='abc' is text, not an integer\. Fix",
    ),
    (
        ["model.lora=8"],
        r"^model\.lora=8 is an integer, not a mapping of settings\. Fix: a mapping with any of rank",
    ),
    (["diagnostics.num_samples=1"], r"diagnostics\.num_samples=1: .*Fix"),
    (["diagnostics.every_n_iterations=-1"], r"diagnostics\.every_n_iterations=-1 .*Fix"),
    (["trainer.devices=2"], r"trainer\.devices=2, .*strategy=None.*Fix: trainer=ddp or trainer=fsdp"),
    (["trainer.devices=auto"], r"trainer\.devices='auto'.*Fix: trainer\.devices=1"),
    (["trainer=ddp", "trainer.devices=3"], r"rollout\.groups=4 does not divide among 3 ranks.*Fix"),
    (["iterations=0"], r"iterations=0 must be ≥ 1"),
    (["algo.optim=0.1"], r"algo\.optim=0\.1 is not a mapping of settings\. Fix: set one of its keys"),
    # types, checked against the config dataclasses' annotations (and the run's own keys) before any build
    (["rollout.groups=abc"], r"rollout\.groups='abc' is text, not an integer\. Fix: rollout\.groups=4$"),
    (["seed=abc"], r"seed='abc' is text, not an integer\. Fix: seed=0$"),
    (
        ["rollout.groups=2.5"],
        r"rollout\.groups=2\.5 is a float, not an integer\. Fix: rollout\.groups=2 or rollout\.groups=3",
    ),
    (
        ["algo.epochs=1.5"],
        r"algo\.epochs=1\.5 is a float, not an integer\. Fix: algo\.epochs=1 or algo\.epochs=2",
    ),
    (
        ["algo.mini_batch_size=2.5"],
        r"algo\.mini_batch_size=2\.5 is a float, not an integer\. Fix: algo\.mini_batch_size=2 or",
    ),
    (["iterations=2.5"], r"^iterations=2\.5 is a float, not an integer\. Fix: iterations=2 or iterations=3"),
    (
        ["max_turns_cap=0"],
        r"^max_turns_cap=0 must be ≥ 1 turn, or null .*Fix: max_turns_cap=3, or max_turns_cap=null",
    ),
    (["max_turns_cap=abc"], r"^max_turns_cap='abc' is text, not an integer or null\. Fix: max_turns_cap=3"),
    (
        ["rollout.temperature=abc"],
        r"rollout\.temperature='abc' is text, not a number\. Fix: rollout\.temperature=1\.0",
    ),
    (
        ["rollout.save_jsonl=1"],
        r"rollout\.save_jsonl=1 is an integer, not true or false\. Fix: rollout\.save_jsonl=false",
    ),
    (["val.every_n_iterations=1.5"], r"val\.every_n_iterations=1\.5 is a float, not an integer\. Fix"),
    (["env.max_turns=2.5"], r"env\.max_turns=2\.5 is a float, not an integer\. Fix: env\.max_turns=2 or"),
    (["model.dtype=16"], r"model\.dtype=16 is an integer, not text\. Fix: model\.dtype='float32'"),
    (["algo.optim.lr=abc"], r"algo\.optim\.lr='abc' is text, not a number\. Fix: algo\.optim\.lr=1e-06"),
    (
        ["algo.optim.betas=[0.9,abc]"],
        r"algo\.optim\.betas=\[0\.9, 'abc'\] is a list, not a list of 2 numbers\. Fix",
    ),
    (
        ["algo.share_prompt_prefix=1"],
        r"algo\.share_prompt_prefix=1 is an integer, not true or false\. Fix: .*=false",
    ),
    # types of what a config node hands its _target_, against the target's annotations, named where set
    (["filter.value=abc"], r"^filter\.value='abc' is text, not a number\. Fix: filter\.value=0\.9$"),
    (["algo=ppo", "algo.critic.lr=abc"], r"^algo\.critic\.lr='abc' is text, not a number\. Fix"),
    (
        ["diagnostics.every_n_iterations=1.5"],
        r"^diagnostics\.every_n_iterations=1\.5 is a float, not an integer\. Fix: diagnostics\.every_n_iterations=1",
    ),
    (
        ["callbacks.checkpoint.every_n_iterations=abc"],
        r"^callbacks\.checkpoint\.every_n_iterations='abc' is text, not an integer\. Fix",
    ),
    (
        ["logger=wandb", "logger.wandb.offline=abc"],
        r"^logger\.wandb\.offline='abc' is text, not true or false",
    ),
    # silent footguns
    (
        ["rollout.temperature=0"],
        r"rollout\.temperature=0 samples greedily: the rollout\.group_size=4 rollouts of a group are one and "
        r"the same episode.*filter keeps none.*Fix: rollout\.temperature=1\.0",
    ),
    (
        ["model.name_or_path=/nonexistent"],
        r"model\.name_or_path='/nonexistent' is no folder \(nothing there\) and no hub name\. Fix: a local HF "
        r"model folder",
    ),
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


def test_an_unwritable_checkpoint_folder_fails_at_start_up(no_model_loads: None, tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("a file where the folder would go")
    dirpath = taken / "checkpoints"
    with pytest.raises(
        ValueError,
        match=rf"^callbacks\.checkpoint\.dirpath={dirpath} cannot be written: {taken} is a file, not a folder\. "
        r"Fix: callbacks\.checkpoint\.dirpath=<a writable folder>$",
    ):
        run(compose(["model=tiny", f"callbacks.checkpoint.dirpath={dirpath}"], run_dir=str(tmp_path / "run")))
    with pytest.raises(ValueError, match=rf"^run_dir={taken / 'run'} cannot be written: .*Fix: run_dir="):
        run(compose(["model=tiny"], run_dir=str(taken / "run")))
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_checkpoint_folder_fails_at_start_up(no_model_loads: None, tmp_path: Path) -> None:
    read_only = tmp_path / "read_only"
    read_only.mkdir(mode=0o555)
    with pytest.raises(ValueError, match=rf"{read_only} does not take new files \(Permission denied\)"):
        run(compose(["model=tiny"], run_dir=str(read_only / "run")))


def test_a_qwen_model_without_a_local_copy_says_how_to_get_one(
    no_model_loads: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import huggingface_hub

    # hub downloads off (ragen2's default) and an empty Hugging Face cache
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("RAGEN2_MODELS", raising=False)
    with pytest.raises(
        ValueError,
        match=r"^model\.name_or_path='Qwen/Qwen2\.5-0\.5B-Instruct' is no local folder, and as a hub name it is "
        r"not in the local Hugging Face cache .*hub downloads are off \(HF_HUB_OFFLINE=1.*Fix: HF_HUB_OFFLINE=0 "
        r"to download it, RAGEN2_MODELS=<folder holding a copy>",
    ):
        run(compose(["model=qwen2.5_0.5b"], run_dir=str(tmp_path / "run")))

    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setenv("RAGEN2_MODELS", str(models))
    with pytest.raises(
        ValueError,
        match=rf"RAGEN2_MODELS={models} holds no Qwen2\.5-0\.5B-Instruct folder\. Fix: put the model there",
    ):
        run(compose(["model=qwen2.5_0.5b"], run_dir=str(tmp_path / "run")))


def test_a_local_copy_under_ragen2_models_is_taken(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from ragen2.config import settings
    from ragen2.models.loading import ModelConfig, resolve_model_path

    # the tiny model's folder stands in for a copy of Qwen2.5-0.5B-Instruct
    (tmp_path / "Qwen2.5-0.5B-Instruct").symlink_to(resolve_model_path("tiny"))
    monkeypatch.setenv("RAGEN2_MODELS", str(tmp_path))
    node = OmegaConf.to_container(compose(["model=qwen2.5_0.5b"]).model, resolve=True)
    model = settings(ModelConfig, node, "model")
    assert model.name_or_path == str(tmp_path / "Qwen2.5-0.5B-Instruct")


# nodes that are no mapping: text, and a list of pairs (which dict() would have read as one)
NOT_MAPPINGS = [
    ("ragen2/Sokoban-v0", "'ragen2/Sokoban-v0' is text"),
    ([["id", "x"]], "[['id', 'x']] is a list"),
]


@pytest.mark.parametrize(("node", "said"), NOT_MAPPINGS, ids=["text", "pairs"])
def test_a_node_that_is_no_mapping_is_named_with_its_value(node: object, said: str) -> None:
    from ragen2.config import ConfigError, settings
    from ragen2.data.rollout_config import EnvConfig

    with pytest.raises(
        ConfigError,
        match=rf"^env={re.escape(said)}, not a mapping of settings\. Fix: a mapping "
        r"with any of id, max_turns, max_actions_per_turn, kwargs, ",
    ):
        settings(EnvConfig, node, "env")


def test_wandb_online_is_not_overridden_by_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ragen2.config import build

    # a WANDB_MODE in the environment (slurm/env.sh exports one; Lightning sets dryrun for an offline logger)
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose(["logger=wandb", "logger.wandb.offline=false"], run_dir=str(tmp_path))
    logger = build(cfg.logger.wandb)
    # what the logger hands wandb.init: its mode= beats WANDB_MODE (wandb's settings precedence)
    assert logger._wandb_init["mode"] == "online"
    offline = build(compose(["logger=wandb"], run_dir=str(tmp_path)).logger.wandb)
    assert offline._offline and "mode" not in offline._wandb_init


def test_the_environment_defaults_leave_wandb_to_the_config_and_hub_downloads_to_one_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ragen2._env import set_defaults

    monkeypatch.setattr(os, "environ", {})
    set_defaults()
    assert "WANDB_MODE" not in os.environ
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["TRANSFORMERS_OFFLINE"] == "1"
    monkeypatch.setattr(os, "environ", {"HF_HUB_OFFLINE": "0"})
    set_defaults()
    assert os.environ["TRANSFORMERS_OFFLINE"] == "0"
