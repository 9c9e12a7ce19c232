"""Shared test helpers (``from helpers import …``): hand-made turns and episodes, env configs as composed, ports
for the daemons and ranks a test starts, a scripted LM, packages outside ragen2 installed as a user's are, and
SearchQA's solver through its tools."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace

import torch
from omegaconf import DictConfig

from ragen2.agent.episode import Episode, Turn
from ragen2.config import compose
from ragen2.rollout.scripted import ScriptedSampler


def turn(
    prompt: Sequence[int],
    sampled: Sequence[int],
    reward: float = 0.0,
    penalty: float = 0.0,
    finish_reason: str = "stop",
    entropies: Sequence[float] | None = None,
) -> Turn:
    """A well-formed turn (a bad one when ``penalty`` < 0) whose reasoning is its first sampled id."""
    return Turn(
        prompt_ids=list(prompt),
        sampled_ids=list(sampled),
        sampler_logprobs=[-0.5] * len(sampled),
        text="",
        finish_reason=finish_reason,
        observation="",
        format_ok=penalty == 0.0,
        actions=["a"],
        actions_valid=[True],
        reward=reward,
        penalty=penalty,
        reasoning_ids=list(sampled[:1]),
        entropies=None if entropies is None else list(entropies),
    )


def episode(group: int, turns: Sequence[Turn], sample: int = 0, seed: int | None = None) -> Episode:
    return Episode(
        env_id="x",
        seed=group if seed is None else seed,
        group=group,
        sample=sample,
        system_prompt="",
        turns=list(turns),
    )


def env_conf(name: str) -> DictConfig:
    """``conf/env/<name>.yaml`` as the training config composes it, with the env's own turn limit."""
    return compose([f"env={name}", "max_turns_cap=null"]).env


#: the package outside ragen2 (tests/envs/outside): its env's ids, by the ways a package registers one
OUTSIDE = Path(__file__).resolve().parent / "envs" / "outside"
OUTSIDE_ENTRY_POINT_ID = "outside/Guess-v0"  # declared in its distribution's ragen2.envs entry points
OUTSIDE_GYM_ID = (
    "outside_envs.register:outside/GuessGym-v0"  # gymnasium.register, run by importing the module
)
OUTSIDE_IDS = (OUTSIDE_ENTRY_POINT_ID, OUTSIDE_GYM_ID)


def install(source: Path, folder: Path, entry_points: str) -> tuple[Path, Path]:
    """The test package in ``source`` (one import package and a ``conf`` folder) laid out in ``folder`` as an
    installed distribution lies in site-packages (the package and its dist-info, whose entry_points.txt is
    ``entry_points``), and the user's own conf folder beside it; returns (the folder to put on sys.path, the
    conf folder)."""
    (package,) = [p for p in source.iterdir() if p.is_dir() and p.name not in ("conf", "__pycache__")]
    site, conf = folder / "site", folder / "conf"
    shutil.copytree(package, site / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(source / "conf", conf)
    info = site / f"{package.name}-0.1.0.dist-info"
    info.mkdir()
    name = package.name.replace("_", "-")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    return site, conf


def install_outside(folder: Path) -> tuple[Path, Path]:
    """tests/envs/outside installed in ``folder`` (``install``): its entry points declare
    ``outside/Guess-v0`` in the ``ragen2.envs`` group."""
    return install(
        OUTSIDE, folder, f"[ragen2.envs]\n{OUTSIDE_ENTRY_POINT_ID} = outside_envs.guess:GuessEnv\n"
    )


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports the OS found free on every interface, all bound at once (so none is picked as
    another's neighbour by chance) and released for a daemon to bind. One can still be taken in between:
    a caller that can retry on a failed start should."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in sockets]


@contextlib.contextmanager
def rendezvous() -> Iterator[dict[str, str]]:
    """The environment under which ranks started inside the block meet (``init_process_group``, env://) at a
    TCPStore this process holds on a port the OS chose: every rank joins it as a client (torchelastic's agent
    store), so no port is released and bound again in between."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        yield {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
    finally:
        del store


def launch_ranks(script: Path, args: Sequence[str], world: int, **env: str) -> None:
    """``python script *args`` as ``world`` ranks that meet (``rendezvous``; RANK and WORLD_SIZE set, tests/ on
    PYTHONPATH, ``env`` added); each must exit 0."""
    tests = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (tests, env.pop("PYTHONPATH", ""), os.environ.get("PYTHONPATH")) if p)
    with rendezvous() as meet:
        common = {**os.environ, **meet, **env, "PYTHONPATH": path, "WORLD_SIZE": str(world)}
        ranks = [
            subprocess.Popen(
                [sys.executable, str(script), *args],
                env={**common, "RANK": str(rank), "OMP_NUM_THREADS": "1"},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(world)
        ]
        done = [(rank.communicate(timeout=400), rank.returncode) for rank in ranks]
    for (_, err), code in done:
        assert code == 0, err[-4000:]


class ScriptLM(torch.nn.Module):
    """A deterministic LM: row i emits ``scripts[last prompt token of row i]`` token by token, then ``default``.

    Its "cache" is the script state, handed back through ``past_key_values`` as the sampler threads it, so
    any token may repeat inside a script. Use it with ``reuse_prefix=False`` (it holds no real keys/values).
    """

    def __init__(self, vocab_size: int, scripts: dict[int, list[int]], default: int) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # so that next(parameters()) has a device
        self.scripts, self.default, self.vocab_size = scripts, default, vocab_size

    def forward(
        self, input_ids: torch.Tensor, past_key_values: object = None, **_: object
    ) -> SimpleNamespace:
        state = past_key_values
        if not isinstance(state, SimpleNamespace):  # first call of a batch: the whole (left-padded) prompt
            state = SimpleNamespace(keys=input_ids[:, -1].tolist(), n=0)
        script = [self.scripts.get(k, []) for k in state.keys]
        nxt = [s[state.n] if state.n < len(s) else self.default for s in script]
        state.n += 1
        logits = torch.full((*input_ids.shape, self.vocab_size), -20.0)
        logits[:, -1, :].scatter_(-1, torch.tensor(nxt)[:, None], 20.0)
        return SimpleNamespace(logits=logits, past_key_values=state)


def trajectory_grid(
    groups: int = 4, size: int = 2, turns: int = 3, seed: int = 0, first_valid: bool = True
) -> list[tuple[tuple[tuple[int, ...], tuple[int, ...] | None], ...]]:
    """Hand-built MI trajectories (``ragen2.diagnostics.sampling.Trajectory``) over a 128-token vocabulary:
    the rollouts of a group share turn 1's X; each later X is the previous X + its own Z + an observation,
    as the token contract builds it. Every Z has 4 ids and all are distinct; ``first_valid=False`` leaves
    turn 1 without a valid Z."""
    gen = torch.Generator().manual_seed(seed)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(torch.randint(3, 128, (n,), generator=gen).tolist())

    system = ids(6)
    out = []
    for g in range(groups):
        first = (*system, 1, g + 3, 2)
        for _ in range(size):
            x, traj = first, []
            for t in range(turns):
                z = ids(4) if first_valid or t > 0 else None
                traj.append((x, z))
                x = (*x, *(z or ids(4)), *ids(3))
            out.append(tuple(traj))
    return out


class ToolSolver(ScriptedSampler):
    """SearchQA's solver through function calls alone: each search on the hop chain a ``search`` call, the
    gold answer a ``finish`` call, followed in the same turn by a search that must not run."""

    def generate(self, prompts, params, seed, meta=None):
        out = []
        for prompt, m in zip(prompts, meta, strict=True):
            kind, argument = re.fullmatch(r"(search|finish)\[(.*)\]", m.oracle).groups()
            calls = [{"name": kind, "arguments": {"query" if kind == "search" else "answer": argument}}]
            if kind == "finish":
                calls.append({"name": "search", "arguments": {"query": "after the end"}})
            text = "Next.</think>" + "".join(f"\n<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls)
            out += ScriptedSampler(self.tokenizer, [text + "<|im_end|>"]).generate([prompt], params, seed)
        return out
