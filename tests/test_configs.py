"""Every config in conf/ composes, and its objects instantiate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from ragen2.config import CONF_DIR, build, compose, validate
from ragen2.errors import ConfigError

# conf/base/ holds the shared defaults the algo and rollout files start from: not a choice
GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("hydra", "base", "sweep"))


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


# Nested groups are chosen inside a parent choice: ragen2-train algo=ppo algo/critic=separate
NESTED = {
    "algo/critic": "algo=ppo",
    "algo/kl_reward": "algo=grpo",
    "algo/advantage": "algo=grpo",
    "algo/policy_loss": "algo=grpo",
}
# GAE needs the critic that algo=ppo brings
PARENT = {("algo/advantage", "gae"): "algo=ppo"}
CASES = [(g, o, f"{g}={o}") for g in GROUPS for o in _options(g)]
CASES += [(g, o, f"{g}={o}") for g in NESTED for o in _options(g)]


@pytest.mark.parametrize(("group", "option", "override"), CASES, ids=[c[2] for c in CASES])
def test_group_option_composes_and_instantiates(
    group: str, option: str, override: str, tmp_path: Path
) -> None:
    # these build only with their optional extra (scripts/install.sh installs them)
    extra = {
        "rollout=vllm": "vllm",
        "logger=mlflow": "mlflow",
        "env=reasoning_gym": "reasoning_gym",
        "env=gem": "gem",
        "env=openenv": "openenv",
        "env=verifiers": "verifiers",
    }.get(override)
    if extra:
        pytest.importorskip(extra, reason=f"{extra} is not installed")
    parent = PARENT.get((group, option), NESTED.get(group))
    cfg = compose([*([parent] if parent else []), override, "model=tiny"], run_dir=str(tmp_path))
    if (
        cfg.trainer.accelerator == "gpu" and not torch.cuda.is_available()
    ):  # refused here (no GPU): the rest of the option is checked on CPU
        cfg.trainer.accelerator = "cpu"
    checked = validate(cfg)  # every value of every option fits its key's type
    data, module = checked.handed(cfg.data), checked.handed(cfg.module)
    assert data.env.id == cfg.env.id
    assert module.algo.mini_batch_size == cfg.algo.mini_batch_size
    for node in ("callbacks", "logger"):
        for c in (cfg.get(node) or {}).values():
            if c is not None:
                instantiate(c)
    instantiate(cfg.trainer)


def test_the_run_is_handed_the_nodes_its_checks_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DataModule and the module get the env, rollout, val, filter, model and algo objects ``validate``
    built (each built once), and Hydra builds what is not one of them; a data node of a user's without a
    key is not given it."""
    from ragen2.data import GroupFilter

    cfg = compose(["model=tiny", "algo=dapo"], run_dir=str(tmp_path))
    built, check = [], GroupFilter.__post_init__
    monkeypatch.setattr(GroupFilter, "__post_init__", lambda self: (built.append(self), check(self))[1])
    checked = validate(cfg)
    data, module = checked.handed(cfg.data), checked.handed(cfg.module)
    for name, value in (("env", data.env), ("rollout", data.rollout_cfg), ("val", data.val)):
        assert value is checked.nodes[name]
    assert data.filter is checked.nodes["filter"] and len(built) == 1
    assert module.model_cfg is checked.nodes["model"] and module.algo is checked.nodes["algo"]
    assert data.sampling is not None and data.sampling.max_rounds == cfg.algo.sampling.max_rounds  # by Hydra
    del cfg.data.val
    assert checked.handed(cfg.data).val == type(data.val)()  # the DataModule's default


def test_gae_needs_the_critic_that_ppo_brings(tmp_path: Path) -> None:
    module = instantiate(
        compose(["model=tiny", "algo=grpo", "algo/advantage=gae", "algo/critic=value_head"]).module
    )
    assert module.critic is not None and module.algo.advantage.needs_values
    with pytest.raises(ConfigError, match="needs a critic's values, and algo.critic is null"):
        build(compose(["model=tiny", "algo=grpo", "algo/advantage=gae"]).module)
    with pytest.raises(ConfigError, match="without '\\+'"):
        compose(["model=tiny", "algo=ppo", "+algo/critic=separate"])


def test_eval_config_composes() -> None:
    cfg = compose(["env=frozenlake"], config_name="eval")
    assert cfg.env.id == "ragen2/FrozenLake-v0" and cfg.num_seeds > 0
    assert cfg.env.max_turns == 5  # evaluation without a checkpoint: the env's own turn limit


@pytest.mark.parametrize("override", ["algo=_common", "algo=base", "rollout=base"])
def test_shared_bases_are_not_choices(override: str) -> None:
    from hydra.errors import HydraException

    with pytest.raises(HydraException, match="Could not find"):
        compose([override])


def test_the_clipped_surrogate_is_written_once() -> None:
    files = [p for p in CONF_DIR.rglob("*.yaml") if "clipped_surrogate" in p.read_text()]
    assert files == [CONF_DIR / "algo" / "policy_loss" / "clipped.yaml"]


@pytest.mark.parametrize(
    ("dtype", "extra", "warns"),
    [
        ("bfloat16", [], True),
        ("float16", [], True),
        ("float32", [], False),
        ("bfloat16", ["model/lora=default"], False),  # the optimizer steps fp32 adapters; the base is frozen
    ],
)
def test_half_precision_weights_warn_that_small_steps_are_lost(
    dtype: str, extra: list[str], warns: bool, caplog: pytest.LogCaptureFixture
) -> None:
    from ragen2.config import validate

    cfg = compose([f"model.dtype={dtype}", "algo.optim.lr=1e-6", *extra])
    with caplog.at_level("WARNING", logger="ragen2"):
        validate(cfg)
    assert ("rounded away" in caplog.text) is warns
    if warns and dtype == "bfloat16":
        # lr · 2^9 = 5.12e-4: above it a weight's half-ulp exceeds the step, and the step is lost for real
        assert "above 5.1e-04" in caplog.text
        w = torch.tensor([5.2e-4, 0.02, -0.3], dtype=torch.bfloat16)
        assert torch.equal(w + 1e-6, w)


def test_the_paper_experiments_keep_fp32_weights_under_bf16_compute() -> None:
    for experiment in ("paper_sokoban", "paper_frozenlake"):
        cfg = compose([f"experiment={experiment}"])
        assert (cfg.model.dtype, cfg.trainer.precision) == ("float32", "bf16-mixed")


@pytest.mark.parametrize("precision", ["bf16-true", "16-true"])
def test_a_precision_that_casts_the_batch_is_refused(precision: str) -> None:
    from ragen2.config import validate

    cfg = compose(["trainer=fsdp", "trainer.devices=1", f"trainer.precision={precision}"])
    with pytest.raises(
        ConfigError, match=rf"trainer.precision={precision}.*Fix: trainer.precision=\S+-mixed"
    ):
        validate(cfg)


def test_shared_prompt_passes_are_refused_under_fsdp() -> None:
    from ragen2.config import validate

    validate(compose(["trainer=ddp", "algo.share_prompt_prefix=true"]))
    with pytest.raises(ConfigError, match=r"algo.share_prompt_prefix=true with trainer=fsdp.*Fix:"):
        validate(compose(["trainer=fsdp", "algo.share_prompt_prefix=true"]))


def test_val_every_n_iterations_0_turns_lightnings_validation_off() -> None:
    assert instantiate(compose(["val.every_n_iterations=1"]).trainer).limit_val_batches == 1.0
    assert instantiate(compose(["val.every_n_iterations=0"]).trainer).limit_val_batches == 0


@pytest.mark.slow
def test_val_every_n_iterations_0_means_no_validation(tmp_path: Path) -> None:
    """Lightning's validation interval is val.every_n_iterations; at 0 (documented as no validation) Lightning
    divided by it once iteration 0 ended. Validation is now off through limit_val_batches=0 instead."""
    from ragen2.train import run

    fast = ["model=tiny", "rollout=scripted", "iterations=1", "diagnostics=off", "logger.tensorboard=null"]
    fast += ["rollout.groups=2", "rollout.group_size=2", "algo.mini_batch_size=2", "max_turns_cap=1"]
    metrics = run(compose([*fast, "val.every_n_iterations=0"], run_dir=str(tmp_path)))
    assert metrics["train/iteration"] == 0
    assert not [k for k in metrics if k.startswith("val/")]
    assert "val/" not in (tmp_path / "csv" / "metrics.csv").read_text()
