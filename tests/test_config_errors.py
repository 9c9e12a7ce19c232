"""Bad config values fail at start-up, before any model loads, naming the key, the value and the fix."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import transformers
from hydra.errors import HydraException

from ragen2.config import compose
from ragen2.models.loading import resolve_model_path
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
    (["filter.strategy=top_k", "filter.value=1.5"], r"filter\.value=1\.5: top_k .*\(0, 1\]\. Fix"),
    (["filter.value=0"], r"filter\.value=0: top_p .*Fix: filter\.value=0\.9"),
    (["filter.score=rv"], r"filter\.score='rv' is unknown\. Fix: choose one of reward_std"),
    (["filter.strategy=topp"], r"filter\.strategy='topp' is unknown\. Fix: choose one of top_p"),
    (["filter.mode=exp"], r"filter\.mode='exp' is unknown\. Fix: choose one of linear, softmax"),
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
    (["seed=-1"], r"^seed=-1 is outside 0 … 4294967295, the seeds numpy takes .*Fix: seed=0$"),
    # numbers that are not finite: a comparison such as lr > 0 lets nan and inf through
    (
        ["rollout.temperature=nan"],
        r"^rollout\.temperature=nan is not a finite number .*Fix: rollout\.temperature=1\.0$",
    ),
    (
        ["rollout.temperature=inf"],
        r"^rollout\.temperature=inf is not a finite number .*Fix: rollout\.temperature=1\.0$",
    ),
    (["algo.optim.lr=inf"], r"^algo\.optim\.lr=inf is not a finite number .*Fix: algo\.optim\.lr=1e-06$"),
    (
        ["algo.optim.weight_decay=inf"],
        r"^algo\.optim\.weight_decay=inf is not a finite .*Fix: algo\.optim\.weight_decay=0\.01$",
    ),
    (
        ["rollout.format_penalty=-inf"],
        r"^rollout\.format_penalty=-inf is not a finite .*Fix: rollout\.format_penalty=-0\.1$",
    ),
    (
        ["algo.optim.betas=[0.9,nan]"],
        r"^algo\.optim\.betas=\[0\.9, nan\] holds a number that is not finite .*Fix: algo\.optim\.betas=\[0\.9, 0\.999\]$",
    ),
    (["filter.value=nan"], r"^filter\.value=nan is not a finite number .*Fix: filter\.value=0\.9$"),
    (
        ["algo=ppo", "algo.critic.lr=inf"],
        r"^algo\.critic\.lr=inf is not a finite number .*Fix: algo\.critic\.lr=1e-05$",
    ),
    # env.kwargs against the options the env's constructor declares (ragen2_envs.options)
    (
        ["+env.kwargs.sucess_rate=0.5"],
        r"^env\.kwargs\.sucess_rate=0\.5 is not an option of ragen2/FrozenLake-v0\. Fix: env\.kwargs\.success_rate=0\.5$",
    ),
    (
        ["+env.kwargs.colour=red"],
        r"^env\.kwargs\.colour='red' is not an option of .*Fix: one of size, p, success_rate,",
    ),
    (
        ["env.kwargs.success_rate=2"],
        r"^env\.kwargs\.success_rate=2 must be in \[0\.0, 1\.0\]\. Fix: env\.kwargs\.success_rate=",
    ),
    (["env.kwargs.size=-1"], r"^env\.kwargs\.size=-1 must be ≥ 2\. Fix: env\.kwargs\.size=4$"),
    (["env.kwargs.p=0"], r"^env\.kwargs\.p=0 must be in \(0\.0, 1\.0\]\. Fix: env\.kwargs\.p=0\.9$"),
    (
        ["env.kwargs.size=abc"],
        r"^env\.kwargs\.size='abc' is text, not an integer\. Fix: env\.kwargs\.size=4$",
    ),
    (
        ["env.kwargs.observation=rgb"],
        r"^env\.kwargs\.observation='rgb' is not one of grid, coord, grid_coord\. Fix",
    ),
    (
        ["env=sokoban", "env.kwargs.num_boxes=0"],
        r"^env\.kwargs\.num_boxes=0 must be ≥ 1\. Fix: env\.kwargs\.num_boxes=1$",
    ),
    (["env=bandit", "env.kwargs.split=val"], r"^env\.kwargs\.split='val' is not one of test, train\. Fix"),
    (
        ["env=searchqa", "env.kwargs.retriever=tfidf"],
        r"^env\.kwargs\.retriever='tfidf' is not one of bm25, dense",
    ),
    (  # what only two options decide together, the constructor refuses when the env is first made
        ["env=countdown", "env.kwargs.min_numbers=5"],
        r"^env\.kwargs of ragen2/Countdown-v0: countdown min_numbers=5, max_numbers=4: need min_numbers <= "
        r"max_numbers\. Fix: change the env\.kwargs named",
    ),
    # keys added with + that nothing reads
    (
        ["+foo=1"],
        r"^foo=1 is not a key of ragen2-train's config\. Fix: one of seed, iterations, max_turns_cap,",
    ),
    (["+sede=1"], r"^sede=1 is not a key of ragen2-train's config\. Fix: seed=1$"),
    (
        ["+algo.max_token_per_micro_batch=1"],
        r"^algo\.max_token_per_micro_batch=1 is not a setting\. Fix: algo\.max_tokens_per_micro_batch=1$",
    ),
    (
        ["+trainer.max_epoch=3"],
        r"^trainer\.max_epoch=3 is not an argument of lightning\.Trainer\. Fix: trainer\.max_epochs=3$",
    ),
    (
        ["+rollout.sampler.max_batch_siz=8"],
        r"^rollout\.sampler\.max_batch_siz=8 is not an argument of ragen2\.rollout\.hf\.HFSampler\. Fix: "
        r"rollout\.sampler\.max_batch_size=8$",
    ),
    (  # Lightning's CSVLogger takes the keys ragen2's subclass passes on
        ["+logger.csv.flush_logs_every_n_step=1"],
        r"^logger\.csv\.flush_logs_every_n_step=1 is not an argument .*Fix: logger\.csv\.flush_logs_every_n_steps=1$",
    ),
    (
        ["ckpt_path=hpc"],
        r"^ckpt_path=hpc: there is no hpc_ckpt_<n>\.ckpt in .* and this is no SLURM job .*Fix: ckpt_path=last",
    ),
    (
        ["+callbacks.summary.every=2"],
        r"^callbacks\.summary\.every=2 is not an argument .*Fix: remove callbacks\.summary\.every",
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
    """Any model load fails loudly: the config error must come first. The tiny model's cache folder is built
    beforehand: on an empty cache, building it loads the built-in model, which is no load of the run's."""
    resolve_model_path("tiny")

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


# ragen2-warmstart: the same front door, and its own refusals (the demonstrations are built, no model loads)
WARMSTART_BAD = [
    (["sft.lr=0"], r"^sft\.lr=0 is out of range\. Fix: sft\.lr=1e-4$"),
    (["sft.steps=0"], r"^sft\.steps=0 is out of range\. Fix: sft\.steps=48$"),
    (["sft.batch_size=2.5"], r"^sft\.batch_size=2\.5 is a float, not an integer\. Fix: sft\.batch_size=2 or"),
    (
        ["demos.episodes=0"],
        r"^demos\.episodes=0 leaves the demonstration set empty\. Fix: demos\.episodes=384$",
    ),
    (
        ["env=metamathqa"],
        r"^env\.id=ragen2/MetaMathQA-v0 has no solver that explains its moves .*Fix: one of env=bandit, "
        r"env=countdown, env=frozenlake, env=sokoban, env=sokoban_8x8, env=twohop$",
    ),
    (
        ["demos.reply='{reasoning}<answer>{oracle}</answer>'"],
        r"^demos\.reply='\{reasoning\}<answer>\{oracle\}</answer>': the agent reads the reply .* as \[\] "
        r"\(format ok: False\), not as the solver's \[.*\]\. Fix: ",
    ),
    (
        ["rollout.max_new_tokens=16"],
        r"^rollout\.max_new_tokens=16 cuts the demonstrated reply of \d+ tokens \(seed \d+, turn 1\).*Fix: "
        r"rollout\.max_new_tokens=\d+",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), WARMSTART_BAD, ids=[" ".join(o) for o, _ in WARMSTART_BAD])
def test_a_bad_warm_start_fails_before_the_model_loads(
    overrides: list[str], message: str, no_model_loads: None, tmp_path: Path
) -> None:
    from ragen2.warmstart import run as warmstart

    cfg = compose(
        ["model=tiny", "demos.episodes=4", *overrides], config_name="warmstart", run_dir=str(tmp_path)
    )
    with pytest.raises(ValueError, match=message):
        warmstart(cfg)
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize(("override", "missing", "an_option"), TYPOS, ids=[t[0] for t in TYPOS])
def test_group_name_typo_lists_the_options(override: str, missing: str, an_option: str) -> None:
    with pytest.raises(
        HydraException, match=rf"(?s)Could not find '{missing}'.*Available options.*{an_option}"
    ):
        compose([override])


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

    from ragen2.models.loading import ModelConfig, resolve_model_path
    from ragen2.settings import settings

    # the tiny model's folder stands in for a copy of Qwen2.5-0.5B-Instruct
    (tmp_path / "Qwen2.5-0.5B-Instruct").symlink_to(resolve_model_path("tiny"))
    monkeypatch.setenv("RAGEN2_MODELS", str(tmp_path))
    node = OmegaConf.to_container(compose(["model=qwen2.5_0.5b"]).model, resolve=True)
    model = settings(ModelConfig, node, "model")
    assert model.name_or_path == str(tmp_path / "Qwen2.5-0.5B-Instruct")


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ({"config.json": "{not json"}, r"holds a config\.json that is not JSON \(Expecting property name"),
        ({"config.json": '{"hidden_size": 8}'}, r"holds a config\.json without model_type"),
        ({"config.json": '{"model_type": "llama"}'}, r"holds no weights \(model\.safetensors, "),
        (
            {"config.json": '{"model_type": "llama"}', "model.safetensors": ""},
            r"holds no tokenizer \(tokenizer\.json, ",
        ),
    ],
    ids=["invalid-json", "no-model-type", "config-only", "no-tokenizer"],
)
def test_a_model_folder_that_cannot_load_is_one_line_at_start_up(
    files: dict[str, str], said: str, no_model_loads: None, tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    with pytest.raises(
        ValueError,
        match=rf"^model\.name_or_path='{folder}' {said}.*not a model folder that loads\. Fix: the folder",
    ) as err:
        run(compose([f"model.name_or_path={folder}"], run_dir=str(tmp_path / "run")))
    assert "\n" not in str(err.value)


def test_the_plus_overrides_in_use_still_pass(tmp_path: Path) -> None:
    from ragen2.config import validate

    # a keyword for wandb.init, a loss's own argument, an env option the yaml leaves out, a new callback
    validate(
        compose(
            [
                "model=tiny",
                "env=sokoban",
                "logger=wandb",
                "+logger.wandb.id=abc",
                "algo.policy_loss._target_=poisoned.PoisonedLoss",
                "+algo.policy_loss.calls=[0]",
                "+env.kwargs.num_gen_steps=5",
                "+callbacks.fault._target_=integration.checkpoint_faults.Sigterm",
                "+callbacks.fault.iteration=0",
            ],
            run_dir=str(tmp_path),
        )
    )


def test_a_config_file_that_sets_an_argument_its_target_does_not_take_names_the_argument_meant() -> None:
    from omegaconf import open_dict

    from ragen2.errors import ConfigError
    from ragen2.settings import check_target_types

    cfg = compose(["model=tiny"])
    with open_dict(cfg):  # a copy of conf/callbacks/default.yaml with a misspelt key
        cfg.callbacks.collapse.mi_fractoin = 0.5
    with pytest.raises(
        ConfigError,
        match=r"^callbacks\.collapse\.mi_fractoin=0\.5 is not an argument of .*\. Fix: callbacks\.collapse\.mi_fraction=0\.5$",
    ):
        check_target_types(cfg)


# nodes that are no mapping: text, and a list of pairs (which dict() would have read as one)
NOT_MAPPINGS = [
    ("ragen2/Sokoban-v0", "'ragen2/Sokoban-v0' is text"),
    ([["id", "x"]], "[['id', 'x']] is a list"),
]


@pytest.mark.parametrize(("node", "said"), NOT_MAPPINGS, ids=["text", "pairs"])
def test_a_node_that_is_no_mapping_is_named_with_its_value(node: object, said: str) -> None:
    from ragen2.data.rollout_config import EnvConfig
    from ragen2.errors import ConfigError
    from ragen2.settings import settings

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


# ---- the run folder -----------------------------------------------------------------------------------
RUN = ["model=tiny", "rollout=scripted", "trainer.limit_val_batches=0", "~callbacks.curves"]


def _iterations(run_dir: Path) -> list[int]:
    import csv

    with (run_dir / "csv" / "metrics.csv").open(newline="") as f:
        return [int(float(r["train/iteration"])) for r in csv.DictReader(f) if r.get("train/iteration")]


def test_a_run_folder_holding_a_run_is_continued_only_when_ckpt_path_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from ragen2.errors import ConfigError

    for key in ("SLURM_JOB_ID", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(key, raising=False)
    run_dir = tmp_path / "run"
    run(compose([*RUN, "iterations=1"], run_dir=str(run_dir)))
    metrics = (run_dir / "csv" / "metrics.csv").read_bytes()
    elsewhere = tmp_path / "elsewhere.ckpt"
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", elsewhere)
    refusals = [
        ([], "ckpt_path=auto does not continue it"),  # the same command twice
        (["ckpt_path=null"], "ckpt_path=null does not continue it"),
        ([f"ckpt_path={elsewhere}"], f"ckpt_path={re.escape(str(elsewhere))} is another run's"),
    ]
    for overrides, said in refusals:
        with pytest.raises(
            ConfigError,
            match=rf"^run_dir={run_dir} already holds a run \(csv/metrics\.csv with 1 row; checkpoints/last\.ckpt\), "
            rf"and {said}: a new run there would write over its metrics\. Fix: a new folder for a new run "
            r"\(hydra\.run\.dir=<folder>; --multirun: hydra\.sweep\.dir=<folder>\), or ckpt_path=last",
        ):
            run(compose([*RUN, "iterations=2", *overrides], run_dir=str(run_dir)))
        assert (run_dir / "csv" / "metrics.csv").read_bytes() == metrics  # nothing lost
    run(compose([*RUN, "iterations=2", "ckpt_path=last"], run_dir=str(run_dir)))  # continued: appended
    assert _iterations(run_dir) == [0, 1]


def test_which_ckpt_path_continues_the_run_in_its_folder(tmp_path: Path) -> None:
    from ragen2.lifecycle.folder import continues, held_run

    run_dir, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    assert held_run(run_dir, checkpoints) is None
    (run_dir / "csv").mkdir(parents=True)
    (run_dir / "csv" / "metrics.csv").write_text("step,train/iteration\n")
    assert held_run(run_dir, checkpoints) is None  # a header and no row: nothing logged yet
    (run_dir / "csv" / "metrics.csv").write_text("step,train/iteration\n0,0\n1,1\n")
    assert held_run(run_dir, checkpoints) == "csv/metrics.csv with 2 rows"
    # a requeued job that saved no checkpoint yet starts over its own attempt; nothing else continues
    assert continues("auto", run_dir, checkpoints, restartable=True)
    assert not continues("auto", run_dir, checkpoints, restartable=False)
    assert not continues("last", run_dir, checkpoints, restartable=True)
    assert not continues("hpc", run_dir, checkpoints, restartable=True)
    checkpoints.mkdir()
    (checkpoints / "last.ckpt").write_bytes(b"")
    (run_dir / "hpc_ckpt_3.ckpt").write_bytes(b"")
    assert held_run(run_dir, checkpoints) == "csv/metrics.csv with 2 rows; checkpoints/last.ckpt"
    assert continues("last", run_dir, checkpoints, restartable=False)
    assert continues("hpc", run_dir, checkpoints, restartable=False)
    assert continues(str(checkpoints / "last.ckpt"), run_dir, checkpoints, restartable=False)
    assert not continues(str(tmp_path / "other" / "last.ckpt"), run_dir, checkpoints, restartable=False)


def _first_run(run_dir: Path) -> dict[Path, bytes]:
    """A folder as a finished run leaves it (its config record, a metrics row), and its files' bytes."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (run_dir / "csv").mkdir()
    (run_dir / "csv" / "metrics.csv").write_text("step,train/iteration\n0,0\n")
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def _cli_error(args: list[str], cwd: Path, program: str = "train") -> str:
    """The one line ``ragen2-<program> <args>`` prints as it fails."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", f"ragen2.{program}", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_the_command_line_refuses_a_used_folder_before_hydra_writes_into_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    before = _first_run(run_dir)
    line = _cli_error([f"hydra.run.dir={run_dir}", "seed=3"], tmp_path)
    assert line.startswith(
        f"ragen2-train: run_dir={run_dir} already holds a run (csv/metrics.csv with 1 row)"
    )
    # the first run's record is as it was: Hydra wrote neither its config nor a log
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before

    sweep = tmp_path / "sweep"
    job = _first_run(sweep / "1")
    line = _cli_error(["--multirun", f"hydra.sweep.dir={sweep}", "seed=0,1"], tmp_path)
    assert line.startswith(f"ragen2-train: run_dir={sweep / '1'} already holds a run")
    assert {p: p.read_bytes() for p in (sweep / "1").rglob("*") if p.is_file()} == job
    assert not (sweep / "0").exists() and not (sweep / "multirun.yaml").exists()


@contextlib.contextmanager
def _read_only(folder: Path) -> Iterator[str]:
    """``folder`` made read-only for this process, yielding how: root ignores permission bits, so for root
    the folder is made immutable (``chattr +i``, which binds root too)."""
    import shutil
    import subprocess

    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield "Permission denied"
        finally:
            folder.chmod(0o755)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)]).returncode:
        pytest.skip("as root, a read-only folder needs chattr +i, which is missing or unsupported here")
    try:
        yield "Operation not permitted"
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_read_only_run_folder_is_one_line_before_hydra_writes_into_it(
    no_model_loads: None, tmp_path: Path
) -> None:
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    with _read_only(read_only) as refused:
        said = rf"cannot be written: {read_only} does not take new files \({refused}\)\. Fix: "
        with pytest.raises(ValueError, match=rf"^run_dir={read_only / 'run'} {said}run_dir="):
            run(compose(["model=tiny"], run_dir=str(read_only / "run")))
        line = _cli_error([f"hydra.run.dir={read_only / 'run'}"], tmp_path)
        assert re.fullmatch(rf"ragen2-train: run_dir={read_only / 'run'} {said}.*hydra\.run\.dir=.*", line), (
            line
        )
        line = _cli_error(["--multirun", f"hydra.sweep.dir={read_only / 'sweep'}", "seed=0,1"], tmp_path)
        assert re.fullmatch(
            rf"ragen2-train: hydra\.sweep\.dir={read_only / 'sweep'} {said}hydra\.sweep.*", line
        )


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["rollout.temperature=0"], "rollout.temperature=0 samples greedily"),
        (["trainer.devices=2"], "trainer.devices=2, trainer.num_nodes=1 with trainer.strategy=None"),
        (["+lr=0.5"], "lr=0.5 is not a key of ragen2-train's config"),
        (["rollout.groups=0"], "rollout.groups=0 must be ≥ 1"),
        (["algo.mini_batch_size=64"], "algo.mini_batch_size=64 exceeds the batch of rollout.groups"),
        (["algo.optim.lr=-1"], "algo.optim.lr=-1 is out of range"),
        (
            ["filter.trajectory_fraction=0"],
            "filter.trajectory_fraction=0: the share of each group's rollouts",
        ),
    ],
    ids=["temperature", "ranks", "top-level-key", "node-range", "mini-batch", "algo", "filter"],
)
def test_the_run_checks_refuse_on_the_command_line_before_hydra_writes_anything(
    overrides: list[str], said: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    line = _cli_error(["model=tiny", f"hydra.run.dir={run_dir}", *overrides], tmp_path)
    assert line.startswith(f"ragen2-train: {said}"), line
    assert not run_dir.exists()  # neither Hydra's log nor its record of the job: the folder is not made


@pytest.mark.parametrize(
    ("program", "overrides", "said"),
    [
        ("eval", ["ks=[1,8]"], "ks=[1, 8] asks for pass@8, which needs 8 sampled rollouts per seed"),
        ("eval", ["num_seeds=many"], "num_seeds='many'"),
        ("diagnose", ["samples=0"], "samples=0 must be ≥ 1 sample per instance"),
        ("warmstart", ["sft.steps=0"], "sft.steps=0"),
        # the nodes the program builds (the env, the rollout, the model, the device), checked as it builds them
        ("eval", ["env.max_turns=0"], "env.max_turns=0 must be ≥ 1. Fix: env.max_turns=1 or more"),
        ("eval", ["rollout.max_new_tokens=0"], "rollout.max_new_tokens=0"),
        ("diagnose", ["env.max_turns=0"], "env.max_turns=0 must be ≥ 1. Fix: env.max_turns=1 or more"),
        ("diagnose", ["+model.revision=main"], "model.revision="),
    ],
    ids=[
        "eval",
        "eval-type",
        "diagnose",
        "warmstart",
        "eval-env",
        "eval-rollout",
        "diagnose-env",
        "diagnose-model",
    ],
)
def test_every_program_checks_its_settings_before_hydra_makes_the_run_folder(
    program: str, overrides: list[str], said: str, tmp_path: Path
) -> None:
    # the checks read ${hydra:runtime.output_dir} as the job will see it, before Hydra sets it
    run_dir = tmp_path / "run"
    line = _cli_error(["model=tiny", f"hydra.run.dir={run_dir}", *overrides], tmp_path, program)
    assert line.startswith(f"ragen2-{program}: {said}"), line
    assert not run_dir.exists()


# ---- resuming: the checkpoint against the settings the run is given ----------------------------------------
@pytest.fixture(scope="module")
def grpo_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FrozenLake GRPO run's last.ckpt, one iteration of the tiny model."""
    run_dir = tmp_path_factory.mktemp("grpo")
    run(compose([*RUN, "iterations=1", "algo.optim.lr=1e-3"], run_dir=str(run_dir)))
    return run_dir / "checkpoints" / "last.ckpt"


def _other_shapes(tmp_path: Path) -> Path:
    """A whole model folder like the tiny model's but half as wide: a model of other shapes (its own weights,
    built from its config, beside the tiny model's tokenizer)."""
    import shutil

    from ragen2.models.loading import resolve_model_path

    tiny = Path(resolve_model_path("tiny"))
    config = transformers.AutoConfig.from_pretrained(tiny)
    heads = config.num_attention_heads
    config.update({"hidden_size": 32, "intermediate_size": 64, "head_dim": 32 // heads})
    folder = tmp_path / "narrow"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny / name, folder / name)
    return folder


def test_a_checkpoint_that_cannot_continue_is_one_line_before_a_model_loads(
    grpo_checkpoint: Path, no_model_loads: None, tmp_path: Path
) -> None:
    import torch

    from ragen2.errors import ConfigError

    with_critic = tmp_path / "with_critic.ckpt"  # as a PPO run's: a value head beside the policy
    state = torch.load(grpo_checkpoint, weights_only=True)
    state["state_dict"]["critic.head.weight"] = torch.zeros(1, 64)
    torch.save({**state, "ragen2": {**state["ragen2"], "algo": "ppo"}}, with_critic)
    narrow = _other_shapes(tmp_path)
    cases = [
        (
            [f"ckpt_path={grpo_checkpoint}", "env=sokoban"],
            r"continues a run on env\.id=ragen2/FrozenLake-v0, and this run sets env\.id=ragen2/Sokoban-v0: .*"
            r"Fix: the checkpoint's env \(env\.id=ragen2/FrozenLake-v0\), or ckpt_path=null",
        ),
        (
            [f"ckpt_path={grpo_checkpoint}", "algo=ppo"],
            r"holds no critic \(its run: algo=grpo\), and algo=ppo trains a value head: .*Fix: algo=grpo, or",
        ),
        (
            [f"ckpt_path={with_critic}"],
            r"holds a value head \(its run: algo=ppo\), and algo=grpo trains no critic: .*Fix: algo=ppo, or",
        ),
        (
            [f"ckpt_path={grpo_checkpoint}", f"model.name_or_path={narrow}"],
            rf"holds the weights of another model than model\.name_or_path={narrow} \(\d+ tensors differ, e\.g\. "
            r"policy\.\S+: \[\d+, 64\] there, \[\d+, 32\] here\)\. Fix: model\.name_or_path=tiny \(the checkpoint's\)",
        ),
    ]
    for n, (overrides, said) in enumerate(cases):
        with pytest.raises(ConfigError, match=rf"^ckpt_path=\S+ {said}") as err:
            run(compose(["model=tiny", *overrides], run_dir=str(tmp_path / f"run{n}")))
        assert "\n" not in str(err.value)


def test_a_resume_with_other_settings_warns_once_per_setting(
    grpo_checkpoint: Path, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from ragen2.lifecycle.checkpoint_fit import check_resume

    cfg = compose(
        ["model=tiny", "algo=dapo", "algo.optim.lr=1e-5", "rollout.temperature=0.7", "env.kwargs.size=5"],
        run_dir=str(tmp_path),
    )
    check_resume(cfg, str(grpo_checkpoint))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    where = f"ckpt_path={grpo_checkpoint}: "
    assert all(w.startswith(where) and "\n" not in w for w in warned), warned
    said = sorted(w[len(where) :] for w in warned)
    assert said == sorted(
        [
            "algo.optim.lr=1e-05 here, 0.001 in the checkpoint; the resumed optimizer keeps 0.001 (its state and "
            "schedule are restored). Fix: ckpt_path=null in a new run folder to train with 1e-05",
            "algo=dapo here, grpo in the checkpoint's run",
            "env.kwargs.size=5 here, 4 in the checkpoint's run; continuing with 5",
            "rollout.max_new_tokens=48 here, 64 in the checkpoint's run; continuing with 48",
            "rollout.temperature=0.7 here, 1.0 in the checkpoint's run; continuing with 0.7",
        ]
    ), said
    caplog.clear()
    check_resume(compose([*RUN, "algo.optim.lr=1e-3"], run_dir=str(tmp_path)), str(grpo_checkpoint))
    assert not [r for r in caplog.records if r.levelname == "WARNING"]  # the run's own settings: silent


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (
            ["+env.kwargs.sucess_rate=0.5"],
            "env.kwargs.sucess_rate=0.5 is not an option of ragen2/FrozenLake-v0. Fix: ",
        ),
        (["seed=-1"], "seed=-1 is outside 0 … 4294967295"),
        (["filter.loss_scaling=linear"], "filter.loss_scaling=linear is not a key of the config. Fix: "),
        (["model.name_or_path={config_only}"], "model.name_or_path='{config_only}' holds no weights"),
    ],
    ids=["env-option", "seed", "unknown-key", "model-folder"],
)
def test_the_command_line_says_it_in_one_line(overrides: list[str], said: str, tmp_path: Path) -> None:
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    (config_only / "config.json").write_text('{"model_type": "llama"}')
    args = [o.format(config_only=config_only) for o in overrides]
    line = _cli_error(["model=tiny", f"hydra.run.dir={tmp_path / 'run'}", *args], tmp_path)
    assert line.startswith(f"ragen2-train: {said.format(config_only=config_only)}"), line
