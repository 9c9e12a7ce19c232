"""ragen2-eval and ragen2-export on a real checkpoint of the real loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ragen2.config import compose


def test_eval_reports_greedy_sampled_pass_at_k_and_oracle(tmp_path: Path) -> None:
    from ragen2.eval import run

    out = tmp_path / "eval.json"
    cfg = compose(
        ["model=tiny", "rollout=scripted", "num_seeds=4", "samples=4", "ks=[1,2,4]", f"output={out}"],
        config_name="eval",
    )
    results = run(cfg)
    written = json.loads(out.read_text())
    for key in ("greedy/success", "sampled/success", "pass@1", "pass@2", "pass@4", "oracle/success"):
        assert key in results and key in written
    # the solver, through the same agent protocol, solves every generated Sokoban puzzle
    assert results["oracle/success"] == 1.0
    assert 0.0 <= results["pass@1"] <= results["pass@2"] <= results["pass@4"] <= 1.0


def test_export_roundtrip_from_a_trained_checkpoint(train, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragen2.export import main as export_main
    from ragen2.models.checkpoint import load_policy

    _, cfg = train(["iterations=1"])
    ckpt = Path(cfg.run_dir) / "checkpoints" / "last.ckpt"
    out = tmp_path / "exported"
    export_main([str(ckpt), str(out)])  # the base model is the one saved in the checkpoint
    exported = AutoModelForCausalLM.from_pretrained(out)
    trained = load_policy("tiny", str(ckpt))
    for (name, a), (_, b) in zip(exported.state_dict().items(), trained.state_dict().items()):
        assert torch.equal(a, b), name
    assert AutoTokenizer.from_pretrained(out).chat_template is not None


def test_an_export_is_readable_as_the_users_umask_allows(train, tmp_path: Path) -> None:
    import os

    from ragen2.export import main as export_main

    _, cfg = train(["iterations=1"])
    out = tmp_path / "exported"
    mask = os.umask(0o022)
    try:
        export_main([str(Path(cfg.run_dir) / "checkpoints" / "last.ckpt"), str(out)])
    finally:
        os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o755  # not mkdtemp's 0700: a vLLM server under another account
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o644


def test_load_policy_rejects_a_mismatched_base(train, tmp_path: Path) -> None:
    from ragen2.models.checkpoint import load_policy

    with pytest.raises(FileNotFoundError, match="checkpoint"):
        load_policy("tiny", str(tmp_path / "missing.ckpt"))
    bogus = tmp_path / "bogus.ckpt"
    torch.save({"state_dict": {"other.weight": torch.zeros(1)}}, bogus)
    with pytest.raises(ValueError, match="no 'policy"):
        load_policy("tiny", str(bogus))


def test_eval_of_a_checkpoint_uses_the_runs_own_settings(train, tmp_path: Path) -> None:
    from ragen2.eval import run

    # a Bandit run (the env's own single turn) with a short token limit and a low temperature
    _, cfg = train(["iterations=1", "env=bandit", "rollout.max_new_tokens=24", "rollout.temperature=0.7"])
    ckpt = Path(cfg.run_dir) / "checkpoints" / "last.ckpt"

    def evaluate(*overrides: str) -> dict:
        out = tmp_path / f"eval{len(list(tmp_path.glob('eval*.json')))}.json"  # a new file each time
        args = [
            f"checkpoint={ckpt}",
            "rollout=scripted",
            "num_seeds=2",
            "samples=2",
            "ks=[1,2]",
            f"output={out}",
            *overrides,
        ]
        eval_cfg = compose(args, config_name="eval")  # eval.yaml's defaults: Sokoban, the built-in model
        run(eval_cfg, overrides=args)
        return json.loads(out.read_text())

    own = evaluate()
    assert (own["env"], own["max_turns"], own["model"]) == ("ragen2/Bandit-v0", 1, "tiny")
    assert own["greedy/turns"] == 1.0  # one turn, as trained (not Sokoban's 5, not the CPU cap of 3)
    assert own["greedy/response_length"] <= 24
    # the command line still wins: another env (its own turn limit), or one key of the run's env
    sokoban = evaluate("env=sokoban")
    assert (sokoban["env"], sokoban["max_turns"]) == ("ragen2/Sokoban-v0", 5)
    assert evaluate("env.max_turns=2")["max_turns"] == 2


def test_eval_never_takes_a_lower_isolation_from_the_checkpoint(
    train, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import ragen2_envs.deepcoder.env as deepcoder

    from ragen2.eval import run
    from ragen2.models.checkpoint import read_checkpoint

    _, cfg = train(["iterations=1", "env=deepcoder"])
    ckpt = Path(cfg.run_dir) / "checkpoints" / "last.ckpt"
    state = read_checkpoint(ckpt, mmap=False)
    state["RolloutDataModule"]["env"]["kwargs"]["allow_unisolated"] = True  # as a shared file could say
    torch.save(state, ckpt)
    asked: list[bool] = []  # what each DeepCoder env the eval makes asks the sandbox for (the real one runs)
    require = deepcoder.require_isolation
    monkeypatch.setattr(deepcoder, "require_isolation", lambda allow: asked.append(allow) or require(allow))

    def evaluate(name: str, *overrides: str) -> None:
        args = [f"checkpoint={ckpt}", "rollout=scripted", "num_seeds=1", "samples=0", "ks=[]", *overrides]
        args.append(f"output={tmp_path / name}")
        run(compose(args, config_name="eval"), overrides=args)

    evaluate("saved.json")
    assert asked and not any(asked)  # the safe default
    (line,) = [r.getMessage() for r in caplog.records if "allow_unisolated" in r.getMessage()]
    assert line.startswith(f"checkpoint={ckpt} saved env.kwargs.allow_unisolated=true: ignored")
    assert line.endswith(
        "Fix: pass ++env.kwargs.allow_unisolated=true on the command line to run its code that way"
    )
    asked.clear()
    evaluate(
        "asked.json", "++env.kwargs.allow_unisolated=true"
    )  # the command line still sets it (the run's env kept)
    assert asked and all(asked)


def _eval_args(out: Path, *overrides: str) -> list[str]:
    return [
        "model=tiny",
        "rollout=scripted",
        "num_seeds=4",
        "samples=2",
        "ks=[1,2]",
        f"output={out}",
        *overrides,
    ]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_eval_writes_each_seed_as_it_finishes_and_an_interrupted_run_keeps_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragen2.eval import run
    from ragen2.rollout.scripted import ScriptedSampler

    out = tmp_path / "full" / "eval.json"
    summary = run(compose(_eval_args(out), config_name="eval"))
    records = _lines(out.with_name("eval.seeds.jsonl"))
    assert records[0]["phase"] == "run" and records[0]["model"] == "tiny"
    by_phase = {p: [r for r in records if r["phase"] == p] for p in ("greedy", "sampled", "oracle")}
    assert all(len(rows) == 4 for rows in by_phase.values())  # one line per seed and phase
    assert sum(r["success"] for r in by_phase["greedy"]) / 4 == summary["greedy/success"]
    assert all(len(r["successes"]) == 2 for r in by_phase["sampled"])

    # stopped (Ctrl-C) at the third turn of the greedy pass: the seeds whose episode had ended are on disk
    generate, calls = ScriptedSampler.generate, []

    def interrupted(self: ScriptedSampler, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(ScriptedSampler, "generate", interrupted)
    cut = tmp_path / "cut" / "eval.json"
    with pytest.raises(KeyboardInterrupt):
        run(compose(_eval_args(cut), config_name="eval"))
    kept = [r for r in _lines(cut.with_name("eval.seeds.jsonl")) if r["phase"] != "run"]
    ended_early = [r for r in by_phase["greedy"] if r["turns"] <= 2]
    assert 0 < len(ended_early) < 4  # some seeds finished in two turns, some did not
    assert kept == ended_early  # the same lines, as the full run wrote them
    assert not cut.exists()  # the summary comes at the end only


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("num_seeds=0", r"num_seeds=0 must be ≥ 1 held-out seed\. Fix: num_seeds=16"),
        ("num_seeds=abc", r"num_seeds='abc' is text, not an integer\. Fix: num_seeds=16"),
        ("samples=-1", r"samples=-1 must be ≥ 0 sampled rollouts per seed .*Fix: samples=4"),
        ("samples=2.5", r"samples=2\.5 is a float, not an integer\. Fix: samples=2 or samples=3"),
        ("ks=[8]", r"ks=\[8\] asks for pass@8, which needs 8 sampled rollouts per seed, and samples=2\. "),
        ("ks=[1,2,8]", r"ks=\[1, 2, 8\] .*Fix: samples=8, or ks=\[1,2\]$"),
        ("ks=4", r"ks=4 is an integer, not a list of integers\. Fix: ks=\[1, 2, 4\]"),
        ("ks=[0]", r"ks=\[0\]: pass@k needs k ≥ 1"),
        ("oracle=maybe", r"oracle='maybe' is text, not true or false"),
    ],
)
def test_eval_refuses_bad_settings_before_anything_loads(tmp_path: Path, override: str, message: str) -> None:
    from ragen2.errors import ConfigError
    from ragen2.eval import run

    # the checkpoint does not exist: an error about it would mean the settings were not checked first
    args = _eval_args(tmp_path / "eval.json", "checkpoint=/nonexistent.ckpt", override)
    with pytest.raises(ConfigError, match=f"^{message}"):
        run(compose(args, config_name="eval"))


def test_eval_refuses_an_output_it_cannot_write_before_anything_loads(tmp_path: Path) -> None:
    from ragen2.errors import ConfigError
    from ragen2.eval import run

    taken = tmp_path / "taken"
    taken.write_text("a file")
    cases = {
        taken
        / "eval.json": rf"output={taken / 'eval.json'} cannot be written: {taken} is a file, not a folder\. "
        r"Fix: output=<a file in a writable folder>",
        tmp_path: rf"output={tmp_path} is a folder\. Fix: output={tmp_path / 'eval.json'}",
    }
    for output, message in cases.items():
        args = _eval_args(output, "checkpoint=/nonexistent.ckpt")
        with pytest.raises(ConfigError, match=f"^{message}$"):
            run(compose(args, config_name="eval"))
    assert taken.read_text() == "a file"


def test_eval_of_a_folder_says_which_checkpoints_it_holds(tmp_path: Path) -> None:
    from ragen2.errors import ConfigError
    from ragen2.eval import run

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    for name in ("last.ckpt", "last.1.ckpt"):
        (run_dir / "checkpoints" / name).write_bytes(b"")
    inside = f"{run_dir}/checkpoints/last.1.ckpt, {run_dir}/checkpoints/last.ckpt"
    for folder, fix in (
        (run_dir, f"pass one of the checkpoints in it: {inside}"),
        (tmp_path / "run" / "checkpoints", "pass one of the checkpoints in it: "),
    ):
        with pytest.raises(
            ConfigError, match=rf"^checkpoint={folder} is a folder, not a checkpoint file\. Fix: {fix}"
        ):
            run(compose(_eval_args(tmp_path / "eval.json", f"checkpoint={folder}"), config_name="eval"))


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one line ``ragen2-export`` exits with (status 1)."""
    from ragen2.export import main as export_main

    with pytest.raises(SystemExit) as exited:
        export_main(list(args))
    assert exited.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


def test_export_replaces_nothing_it_was_not_asked_to(
    train, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragen2.export import main as export_main

    _, cfg = train(["iterations=1"])
    ckpt = Path(cfg.run_dir) / "checkpoints" / "last.ckpt"
    checkpoint_bytes = ckpt.read_bytes()
    # a folder holding another model's shard: refused, the shard kept
    shard = tmp_path / "other" / "model-00001-of-00002.safetensors"
    shard.parent.mkdir()
    shard.write_bytes(b"a shard")
    line = _refused(capsys, str(ckpt), str(shard.parent))
    assert line == (
        f"ragen2-export: out={shard.parent} already holds files, which the export would replace. Fix: another "
        "folder, or --overwrite to replace that folder as a whole"
    )
    assert shard.read_bytes() == b"a shard"
    # a file as the folder (here the checkpoint itself): refused, even with --overwrite
    line = _refused(capsys, str(ckpt), str(ckpt), "--overwrite")
    assert line.startswith(f"ragen2-export: out={ckpt} is a file, and the export is a folder")
    assert ckpt.read_bytes() == checkpoint_bytes
    # a folder that cannot be made: one line
    line = _refused(capsys, str(ckpt), str(shard / "exported"))
    assert line == (
        f"ragen2-export: out={shard / 'exported'} cannot be written: {shard} is a file, not a folder. "
        "Fix: out=<a folder in a writable place>"
    )
    # a --model folder with config.json only (no weights): one line naming it, nothing written
    from ragen2.models.loading import resolve_model_path

    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_bytes((Path(resolve_model_path("tiny")) / "config.json").read_bytes())
    line = _refused(capsys, str(ckpt), str(tmp_path / "new"), "--model", str(config_only))
    assert line.startswith(f"ragen2-export: model.name_or_path='{config_only}' holds no weights (") and (
        "Fix: the folder save_pretrained wrote" in line
    )
    assert not (tmp_path / "new").exists()
    # an empty folder is filled; with --overwrite a full one is replaced as a whole, through a folder beside it
    empty = tmp_path / "empty"
    empty.mkdir()
    export_main([str(ckpt), str(empty)])
    assert (empty / "config.json").is_file()
    export_main([str(ckpt), str(shard.parent), "--overwrite"])
    assert (shard.parent / "config.json").is_file() and not shard.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # nothing staged left
