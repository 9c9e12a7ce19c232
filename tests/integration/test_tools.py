"""Tool-calling turns end to end: an MCP server's tools over stdio, and SearchQA trained through its retriever
as a tool on tiny-qwen2 (Qwen2.5's template, which renders the tools and their results)."""

from __future__ import annotations

import csv
import json
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import open_dict
from ragen2_envs.searchqa.env import SearchQAEnv
from unit.agent.test_tools import ANSWER, CALL

from ragen2.agent.tools import Toolbox, run_call
from ragen2.config import compose
from ragen2.errors import ConfigError
from ragen2.train import run

SERVER = textwrap.dedent(
    """
    from fastmcp import FastMCP

    mcp = FastMCP("arith")

    @mcp.tool
    def add(a: int, b: int) -> int:
        "Add two integers."
        return a + b

    @mcp.tool
    def fail(x: str) -> str:
        "Always raises."
        raise ValueError("no " + x)

    if __name__ == "__main__":
        mcp.run(show_banner=False)
    """
)


def test_an_mcp_servers_tools_are_listed_and_called(tmp_path: Path) -> None:
    pytest.importorskip("fastmcp")
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    box = Toolbox.from_specs([f"mcp:{sys.executable} {server}"], SearchQAEnv)
    tools = box.bind(None)
    assert sorted(tools) == ["add", "fail"]
    assert tools["add"].parameters["required"] == ["a", "b"]
    assert run_call('{"name": "add", "arguments": {"a": 2, "b": 40}}', tools, 30).content == "42"
    wrong = run_call('{"name": "add", "arguments": {"a": "2", "b": 40}}', tools, 30)
    assert wrong.error == "arguments"
    raised = run_call('{"name": "fail", "arguments": {"x": "luck"}}', tools, 30)
    assert raised.error == "raised" and "no luck" in raised.content


def test_an_mcp_server_that_does_not_start_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("fastmcp")
    crash = tmp_path / "crash.py"
    crash.write_text("raise SystemExit(3)\n")
    with pytest.raises(ConfigError, match=r"^env.tools\[0\]='mcp:.*': the MCP server did not start .* Fix:"):
        Toolbox.from_specs([f"mcp:{sys.executable} {crash}"], SearchQAEnv)


def test_tools_under_a_template_without_a_tool_format_stop_the_run(tmp_path: Path) -> None:
    """model=tiny (SmolLM2's template renders content only) asked to use tools: one line before training."""
    overrides = ["model=tiny", "env=searchqa", "env.tools=[search]", "rollout=scripted", "iterations=1"]
    cfg = compose(overrides, run_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"its chat template has no tool format"):
        run(cfg)


@pytest.mark.slow
def test_one_iteration_of_searchqa_through_its_retriever_as_a_tool(tmp_path: Path) -> None:
    """Scripted replies that call ``search`` and answer; one training iteration on tiny-qwen2: tool calls are
    counted, some episodes succeed through them, the update steps, and the saved turns hold the calls."""
    overrides = [
        "model=tiny_qwen2",
        "env=searchqa",
        "env.tools=[search]",
        "rollout=scripted",
        "rollout.groups=2",
        "rollout.save_jsonl=true",
        "filter=none",
        "iterations=1",
        "algo.entropy_coef=0.0",
        "trainer.limit_val_batches=0",
    ]
    cfg = compose(overrides, run_dir=str(tmp_path / "run"))
    with open_dict(cfg):
        cfg.rollout.sampler.responses = [CALL, ANSWER]
    run(cfg)
    run_dir = Path(cfg.run_dir)
    with (run_dir / "csv" / "metrics.csv").open() as f:
        (row,) = [r for r in csv.DictReader(f) if r.get("train/iteration")]
    assert float(row["rollout/tool_calls"]) > 0 and float(row["rollout/tool_errors"]) == 0
    assert float(row["rollout/success"]) > 0 and float(row["train/optimizer_steps"]) >= 1
    records = [json.loads(line) for line in (run_dir / "rollouts.rank0.jsonl").read_text().splitlines()]
    assert any(r["success"] and "tool_calls" in r["turns"][0] for r in records)
