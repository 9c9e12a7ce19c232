"""The frozen reference model exists (and runs) only when a KL term uses it."""

from __future__ import annotations

import pytest

from ragen2.config import compose


@pytest.mark.parametrize(
    ("overrides", "has_ref"),
    [
        ([], False),
        (["algo.kl_coef=0.01"], True),
        (["algo/kl_reward=fixed"], True),
        (["algo=ppo"], False),
        (["algo=ppo", "algo/kl_reward=adaptive"], True),
    ],
)
def test_reference_model_only_with_kl(overrides: list[str], has_ref: bool, tmp_path) -> None:
    from hydra.utils import instantiate

    cfg = compose(["model=tiny", *overrides], run_dir=str(tmp_path))
    module = instantiate(cfg.module)
    module.configure_model()
    assert (module.ref_policy is not None) == has_ref
    if has_ref:
        assert not any(p.requires_grad for p in module.ref_policy.parameters())
        assert all(p.requires_grad for p in module.policy.parameters())
