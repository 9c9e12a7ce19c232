"""``ragen2-lookup``: a verifiers tool environment that ships with ragen2 and runs offline.

A taskset whose tasks carry a tool server, as verifiers 0.4 writes one: each task's ``toolsets`` is a
``LookupToolset`` (a ``vf.Toolset``: an MCP server verifiers launches for the rollout, here as
``python -m ragen2_envs.verifiers.lookup`` in its subprocess runtime) with one tool, ``lookup(key)``, that reads
a code off a table the prompt does not show. The question names a key; the rubric's ``correct`` (weight 1)
pays a reply that is the key's code, which the policy can only know by calling the tool. Under ragen2's tool
mode (``env.tools=['*']``) the policy calls ``lookup`` through its chat template's function-call format and
replies with the code as its answer. The code is the task's ``answer`` (the adapter's oracle).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import verifiers.v1 as vf
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

__all__ = ["LookupTaskset", "LookupToolset"]

SYSTEM = "Find the code filed under the key with the lookup tool, then reply with the code only."
KEYS = ("otter", "heron", "lynx", "marten", "ibis", "newt", "vole", "wren", "yak", "zebu", "bison", "crane")
#: the table the tool reads: one four-digit code per key, fixed for every process that serves it
CODES = {key: str(random.Random(f"lookup/{key}").randint(1000, 9999)) for key in KEYS}


class LookupToolset(vf.Toolset[vf.ToolsetConfig, vf.State]):
    """The table behind the ``lookup`` tool; its tools are advertised bare (no server prefix)."""

    TOOL_PREFIX = None

    @vf.tool
    async def lookup(self, key: str) -> str:
        """The code filed under a key."""
        code = CODES.get(key.strip().lower())
        if code is None:
            raise ToolError(f"no entry for {key!r}; the keys are words such as {KEYS[0]!r}")
        return code


class LookupConfig(vf.TasksetConfig):
    size: int = Field(1000, ge=1)
    seed: int = 0


class LookupData(vf.TaskData):
    answer: str


class LookupTask(vf.Task[LookupData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [LookupToolset(vf.ToolsetConfig())]

    @vf.reward(weight=1.0)
    async def correct(self, task: LookupData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == task.answer)


class LookupTaskset(vf.Taskset[LookupTask, LookupConfig]):
    def load(self) -> Iterator[LookupTask]:
        rng = random.Random(self.config.seed)
        for _ in range(self.config.size):
            key = rng.choice(KEYS)
            yield LookupTask(
                LookupData(
                    prompt=f"Which code is filed under {key!r}?", system_prompt=SYSTEM, answer=CODES[key]
                ),
                self.config.task,
            )


if __name__ == "__main__":  # verifiers launches the tool server as this module
    LookupToolset.run()
