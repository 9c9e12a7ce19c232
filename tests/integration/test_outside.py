"""ragen2 from outside its repository: an environment registered in the user's own package, a filter strategy and
score, a loss aggregation and an advantage estimator from another, the user's configs in a folder of theirs, and
ragen2 installed without -e (docs/extending.md).

The user's packages are tests/envs/outside, installed for the session by the ``outside_envs`` fixture (a
folder on sys.path holding the package and its dist-info, as site-packages would; its env passes the shared
env contract tests in tests/envs/test_all_envs.py), and tests/plugins_outside, installed the same way by
``outside_plugins``: its ``ragen2.plugins`` entry point names the module that registers its entries.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers import OUTSIDE_ENTRY_POINT_ID, OUTSIDE_GYM_ID, install, launch_ranks

from ragen2 import plugins
from ragen2.config import build, compose, validate
from ragen2.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: the user's package of plug points, and the overrides that use every one of them
PLUGINS = ROOT / "tests" / "plugins_outside"
USE_PLUGINS = ("filter=outside", "algo/advantage=median", "algo.loss_agg=seq-mean-token-sqrt")


def _program(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, cwd=cwd, env={**os.environ, **env}, timeout=300
    )


def test_an_env_of_its_own_runs_by_its_config_through_ragen2_conf(
    outside_envs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _, conf = outside_envs
    monkeypatch.setenv("RAGEN2_CONF", str(conf))
    cfg = compose(["env=guess"], run_dir=str(tmp_path))
    assert cfg.env.id == OUTSIDE_ENTRY_POINT_ID and cfg.env.max_turns == 3  # capped by max_turns_cap
    validate(cfg)  # env.kwargs checked against what GuessEnv's constructor declares
    with pytest.raises(
        ConfigError,
        match=r"^env\.kwargs\.hi=8 is not an option of outside/Guess-v0\. Fix: env\.kwargs\.high=8$",
    ):
        validate(compose(["env=guess", "+env.kwargs.hi=8"], run_dir=str(tmp_path)))
    # env.id names it too, by gymnasium's registration (the module is imported first)
    validate(compose(["env=guess", f"env.id={OUTSIDE_GYM_ID}"], run_dir=str(tmp_path)))


def test_an_id_no_package_registers_is_one_line(outside_envs: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^env\.id='outside/Chess-v0' is not a ragen2 environment\. Fix: env=<name>"
    ):
        validate(compose(["env.id=outside/Chess-v0"], run_dir=str(tmp_path)))
    with pytest.raises(
        ConfigError, match=r"^env\.id='no_such_pkg:x/Y-v0': its module 'no_such_pkg' does not import"
    ):
        validate(compose(["env.id=no_such_pkg:x/Y-v0"], run_dir=str(tmp_path)))
    # a registered id that is not a TextEnv: the agent could not play it
    with pytest.raises(
        ConfigError, match=r"^env\.id='CartPole-v1' names .* which is not a ragen2_envs\.TextEnv"
    ):
        validate(compose(["env.id=CartPole-v1"], run_dir=str(tmp_path)))


def test_the_programs_find_a_users_config_folder(outside_envs: tuple[Path, Path], tmp_path: Path) -> None:
    site, conf = outside_envs
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    # RAGEN2_CONF, or Hydra's own search path on the command line
    by_env = _program(
        [str(BIN / "ragen2-train"), "env=guess", "--cfg", "job"],
        tmp_path,
        RAGEN2_CONF=str(conf),
        PYTHONPATH=path,
    )
    assert by_env.returncode == 0, by_env.stderr
    assert f"env:\n  id: {OUTSIDE_ENTRY_POINT_ID}\n" in by_env.stdout
    searched = f"hydra.searchpath=[file://{conf}]"
    by_flag = _program(
        [str(BIN / "ragen2-eval"), searched, "env=guess", "--cfg", "job"], tmp_path, PYTHONPATH=path
    )
    assert by_flag.returncode == 0, by_flag.stderr
    assert f"env:\n  id: {OUTSIDE_ENTRY_POINT_ID}\n" in by_flag.stdout
    # a folder that is not there is one line, before Hydra
    missing = tmp_path / "missing"
    refused = _program([str(BIN / "ragen2-diagnose"), "--cfg", "job"], tmp_path, RAGEN2_CONF=str(missing))
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"ragen2-diagnose: RAGEN2_CONF={missing}: {missing} is not a folder. Fix: RAGEN2_CONF=<the folder holding "
        "your config groups, e.g. <folder>/env/<name>.yaml>, or unset RAGEN2_CONF"
    ]


@pytest.mark.slow
def test_an_env_of_its_own_trains_one_iteration(
    outside_envs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, train
) -> None:
    monkeypatch.setenv("RAGEN2_CONF", str(outside_envs[1]))
    metrics, cfg = train(
        ["env=guess", "iterations=1", "rollout.groups=2", "rollout.group_size=3", "algo.mini_batch_size=6"]
    )
    assert cfg.env.id == OUTSIDE_ENTRY_POINT_ID
    assert metrics["rollout/format_valid_rate"] > 0  # the oracle's guesses are well-formed
    assert metrics["filter/kept"] >= 1 and metrics["train/optimizer_steps"] >= 1, metrics
    assert (Path(cfg.run_dir) / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_an_install_without_editable_mode_composes_the_same_config(tmp_path: Path) -> None:
    # a fresh virtualenv that sees this one's packages (torch, hydra, …) but not its ragen2 (editable, or on
    # PYTHONPATH), and ragen2 built from a copy of the source and installed into it as a wheel
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    source = tmp_path / "source"
    for folder in ("src", "envs", "conf"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAGEN2_CONF")}
    install = [
        str(python),
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        str(source),
    ]
    done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    where = subprocess.run(
        [str(python), "-c", "import ragen2.config as c; print(c.CONF_DIR)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert where.stdout.strip() == f"{purelib}/ragen2/conf", where.stderr
    installed = subprocess.run(
        [str(venv / "bin" / "ragen2-train"), "--cfg", "job"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    here = _program([str(BIN / "ragen2-train"), "--cfg", "job"], tmp_path)
    assert installed.stdout == here.stdout and "env:\n  id: ragen2/FrozenLake-v0\n" in installed.stdout
    # the wheel declares ragen2's own environments in its entry points, and the registry makes them from there
    code = (
        "import importlib.metadata as m, ragen2_envs\n"
        "wheel = m.distribution('ragen2')\n"
        "print(wheel.locate_file(''), sorted(e.name for e in wheel.entry_points if e.group == 'ragen2.envs'))\n"
        "print(type(ragen2_envs.make('ragen2/FrozenLake-v0')).__name__)\n"
    )
    made = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    where_from, own = made.stdout.splitlines()[0].split(" ", 1)
    assert Path(where_from) == Path(purelib) and "'ragen2/TwoHop-v0'" in own and own.count("ragen2/") == 9
    assert made.stdout.splitlines()[1] == "FrozenLakeEnv"


@pytest.fixture(scope="module")
def outside_plugins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """tests/plugins_outside installed as a user's package (``helpers.install``), its entries registered:
    (its site folder, the user's conf folder)."""
    entry_point = "[ragen2.plugins]\noutside = outside_plugins\n"
    site, conf = install(PLUGINS, tmp_path_factory.mktemp("plugins"), entry_point)
    importlib.import_module("ragen2.data.group_filter")  # ragen2's own entries first: they stay
    tables = (plugins.STRATEGIES, plugins.SCORES, plugins.LOSS_AGGREGATIONS)
    before = [set(table) for table in tables]
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    plugins.load()  # a program loads the entry points at its first check; this one started before the install
    added = [set(table) - names for table, names in zip(tables, before)]
    yield site, conf
    sys.path.remove(str(site))
    for table, names in zip(tables, added):
        for name in names:
            del table[name]
    for name in [m for m in sys.modules if m.split(".")[0] == "outside_plugins"]:
        del sys.modules[name]


def test_a_packages_plug_points_are_checked_as_ragen2s_own(
    outside_plugins: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAGEN2_CONF", str(outside_plugins[1]))
    cfg = compose(list(USE_PLUGINS), run_dir=str(tmp_path))
    validate(cfg)  # the estimator's _target_ imports from the user's package
    chosen = build(cfg.filter)
    assert (chosen.score, chosen.strategy, chosen.value) == ("return_range", "bottom_k", 2)
    build(cfg.algo.policy_loss)  # runs the objective once, through the package's aggregation
    with pytest.raises(ConfigError, match=r"^filter\.value=1\.5: bottom_k keeps this many groups, .*Fix"):
        build(compose([*USE_PLUGINS, "filter.value=1.5"], run_dir=str(tmp_path)).filter)
    with pytest.raises(
        ConfigError, match=r"^filter\.strategy='bottom_q' is unknown\. Fix: choose one of .*bottom_k"
    ):
        build(compose(["filter.strategy=bottom_q"], run_dir=str(tmp_path)).filter)
    with pytest.raises(
        ConfigError, match=r"^filter\.score='range' is unknown\. Fix: choose one of .*return_range"
    ):
        build(compose(["filter.score=range"], run_dir=str(tmp_path)).filter)


def test_a_plugin_module_that_does_not_import_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = tmp_path / "broken-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[ragen2.plugins]\nbroken = no_such_module_of_plugins\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError,
        match=r"^the ragen2\.plugins entry point broken = no_such_module_of_plugins does not import \(.*\)\. "
        r"Fix: install what its package needs, or uninstall the package that declares it$",
    ):
        plugins.load()


@pytest.mark.slow
def test_a_packages_estimator_filter_and_aggregation_train_one_iteration(
    outside_plugins: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, train
) -> None:
    from outside_plugins import CALLS

    monkeypatch.setenv("RAGEN2_CONF", str(outside_plugins[1]))
    CALLS.clear()
    metrics, _ = train([*USE_PLUGINS, "iterations=1"])
    assert set(CALLS) == {"return_range", "bottom_k", "seq-mean-token-sqrt", "median_baseline"}, CALLS
    assert metrics["filter/kept"] == 2 and metrics["train/optimizer_steps"] >= 1, metrics
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))


@pytest.mark.slow  # three processes that import Lightning on 2 cores
@pytest.mark.timeout(600)
def test_a_packages_filter_selects_on_two_ranks_as_on_one(
    outside_plugins: tuple[Path, Path], tmp_path: Path
) -> None:
    site, conf = outside_plugins
    script = ROOT / "tests" / "integration" / "multirank_iteration.py"
    chosen = {}
    for world in (1, 2):
        out = tmp_path / f"{world}.pt"
        launch_ranks(script, [str(out), "filter=outside"], world, PYTHONPATH=str(site), RAGEN2_CONF=str(conf))
        ranks = [torch.load(f"{out}.rank{rank}", weights_only=False)["plain"] for rank in range(world)]
        chosen[world] = {key: torch.cat([r[key] for r in ranks]) for key in ("keep", "scores", "keep_rows")}
    for key, value in chosen[1].items():
        assert torch.equal(chosen[2][key], value), key
    # bottom_k keeps the 2 groups of the lowest non-zero return range, wherever they lie
    scores, keep = chosen[1]["scores"], chosen[1]["keep"]
    assert int(keep.sum()) == 2 and scores[keep].max() <= scores[~keep & (scores > 0)].min()
