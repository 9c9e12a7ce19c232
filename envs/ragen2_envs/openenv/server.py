"""Any ragen2 environment as an OpenEnv server (openenv-core's ``create_fastapi_app``), for OpenEnv's clients:
ragen2's own (``env=openenv``) and any other trainer's::

    python -m ragen2_envs.openenv.server ragen2/FrozenLake-v0 --port 8000 --kwargs '{"success_rate": 1.0}'
    python -m ragen2_envs.openenv.server ragen2/SearchQA-v0 --port 8001 --tools   # its tools, over MCP

Each connection gets an env of its own. The action is ``{"message": <one action's text>}``. The observation holds
the env's rendered state (``text``) and, as fields (openenv-core 0.3.0 sends no ``metadata``), ``success``,
``action_is_valid`` and ``truncated``. ``reset`` takes ``seed`` and ``sample`` (the rollout's index in its group,
whose per-step noise it seeds: ragen2's group contract); the session's ``state`` carries the env's solver's next
action (``oracle``), and the server's ``/metadata`` description is the env's instructions.

With ``--tools`` the env's tools (its ``tool_names``) are served instead, as OpenEnv's MCP environment
(``MCPEnvironment``: the actions are ``list_tools`` and ``call_tool``); a tool that moves the env (an ``EnvStep``)
sets the observation's ``reward``, ``done`` and the fields above, and its text is the call's result.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
from collections.abc import Sequence
from typing import Any

import ragen2_envs
from ragen2_envs.adapters import require
from ragen2_envs.base import EnvStep
from ragen2_envs.openenv.env import ENV_ID, INSTALL

api: Any = require("openenv.core.env_server", ENV_ID, INSTALL)
server_types: Any = require("openenv.core.env_server.types", ENV_ID, INSTALL)
mcp_env: Any = require("openenv.core.env_server.mcp_environment", ENV_ID, INSTALL)
mcp_types: Any = require("openenv.core.env_server.mcp_types", ENV_ID, INSTALL)


class TextAction(api.Action):
    """One action of a ragen2 env: its text."""

    message: str


class TextObservation(api.Observation):
    """A ragen2 env's rendered state, and what its ``info`` says of the step."""

    text: str = ""
    success: bool = False
    action_is_valid: bool = True
    truncated: bool = False


class TextState(api.State):
    """The session's episode, and the solver's next action (None where the env has no solver)."""

    oracle: str | None = None


class _Session:
    """What a session of either server holds: its ragen2 env, the episode, and the env's solver's next move."""

    observation: Any  # the observation class reset answers with

    def _open(self, env_id: str, env_kwargs: dict[str, Any]) -> None:
        self.env_id = env_id
        self.env = ragen2_envs.make(env_id, **env_kwargs)
        self.episode_id: str | None = None
        self.steps = 0
        self.started = False  # a ragen2 env has no state to ask its solver about before its first reset

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, sample: int = 0, **kwargs: Any
    ) -> Any:
        text, info = self.env.reset(seed=seed, options={"sample": int(sample)})
        self.episode_id, self.steps, self.started = episode_id, 0, True
        return self.observation(text=text, metadata=_jsonable(info))

    @property
    def state(self) -> TextState:
        oracle = self.env.oracle_action() if self.started else None
        return TextState(episode_id=self.episode_id, step_count=self.steps, oracle=oracle)

    def get_metadata(self) -> Any:
        return server_types.EnvironmentMetadata(name=self.env_id, description=self.env.instructions)


class ServedEnv(_Session, api.Environment):
    """One session's ragen2 env, as an OpenEnv ``Environment``."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session makes its own env: nothing is shared
    observation = TextObservation

    def __init__(self, env_id: str, env_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self._open(env_id, env_kwargs)

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        text, reward, terminated, truncated, info = self.env.step(action.message)
        self.steps += 1
        return TextObservation(text=text, **_stepped(reward, terminated, truncated, info))

    def close(self) -> None:
        self.env.close()


class ToolObservation(mcp_types.CallToolObservation):
    """A tool call's answer (OpenEnv's MCP observation), with what a ragen2 env says of a step that moved it; at
    reset, the env's rendered state (``text``)."""

    tool_name: str = ""
    text: str = ""
    success: bool = False
    action_is_valid: bool = True
    truncated: bool = False


class ToolServedEnv(_Session, mcp_env.MCPEnvironment):
    """One session's ragen2 env with its tools as MCP tools (OpenEnv's ``MCPEnvironment``)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    observation = ToolObservation

    def __init__(self, env_id: str, env_kwargs: dict[str, Any]) -> None:
        from fastmcp import FastMCP

        self._open(env_id, env_kwargs)
        server = FastMCP(env_id)
        for name in getattr(type(self.env), "tool_names", ()):
            server.tool(self._tool(name))
        super().__init__(server)
        self.moved: EnvStep | None = None  # the step the call being answered made

    def _tool(self, name: str) -> Any:
        """The env's method ``name`` as FastMCP reads a tool (its signature and docstring), answering with text;
        a step it makes is kept for the observation."""
        method = getattr(self.env, name)

        def call(**arguments: Any) -> str:
            out = method(**arguments)
            if isinstance(out, EnvStep):
                self.moved, out = out, out.content
            return out if isinstance(out, str) else json.dumps(out, default=str)

        functools.update_wrapper(call, method)
        del call.__wrapped__  # FastMCP reads the signature below, not the method's (which returns an EnvStep)
        call.__signature__ = inspect.signature(method).replace(return_annotation=str)  # type: ignore[attr-defined]
        return call

    async def _async_handle_call_tool(self, action: Any, timeout_s: float | None = None) -> Any:
        self.moved = None
        answered = await super()._async_handle_call_tool(action, timeout_s=timeout_s)
        self.steps += 1
        step, self.moved = self.moved, None
        if step is None:
            return answered
        return ToolObservation(
            tool_name=answered.tool_name,
            result=answered.result,
            error=answered.error,
            **_stepped(step.reward, step.terminated, step.truncated, dict(step.info)),
        )

    def _step_impl(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> ToolObservation:
        return ToolObservation(text="This server takes tool calls only (list_tools, call_tool).")

    def close(self) -> None:
        super().close()
        self.env.close()


def _stepped(reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> dict[str, Any]:
    """An observation's fields for a step of a ragen2 env (openenv-core 0.3.0 sends no ``metadata``: what the
    adapter reads of ``info`` goes as fields)."""
    return {
        "reward": reward,
        "done": terminated or truncated,
        "truncated": truncated,
        "success": bool(info.get("success")),
        "action_is_valid": bool(info.get("action_is_valid", True)),
        "metadata": _jsonable(info),
    }


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` as JSON would carry it (numpy numbers and the like as text)."""
    return json.loads(json.dumps(info, default=str))


def app(
    env_id: str, env_kwargs: dict[str, Any] | None = None, max_sessions: int = 64, tools: bool = False
) -> Any:
    """The FastAPI app serving ``env_id`` (made with ``env_kwargs``) to up to ``max_sessions`` connections: its
    text actions, or (``tools``) its tools over MCP."""
    kwargs = dict(env_kwargs or {})
    env = ragen2_envs.make(env_id, **kwargs)  # a bad id or option fails here, not at the first connection
    if tools and not getattr(type(env), "tool_names", ()):
        raise ValueError(f"{env_id} has no tools to serve (its tool_names is empty). Fix: leave out --tools")
    served = (
        (ToolServedEnv, mcp_types.CallToolAction, ToolObservation)
        if tools
        else (ServedEnv, TextAction, TextObservation)
    )
    return api.create_fastapi_app(
        functools.partial(served[0], env_id, kwargs), *served[1:], max_concurrent_envs=max_sessions
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ragen2_envs.openenv.server",
        description="Serve a ragen2 environment as an OpenEnv server.",
    )
    parser.add_argument("env_id", help="a ragen2 env id, e.g. ragen2/FrozenLake-v0")
    parser.add_argument("--kwargs", default="{}", help="the env's keyword arguments, as JSON")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=64, help="connections served at once")
    parser.add_argument(
        "--tools", action="store_true", help="serve the env's tools over MCP (list_tools, call_tool)"
    )
    args = parser.parse_args(argv)
    import uvicorn

    served = app(args.env_id, json.loads(args.kwargs), args.max_sessions, args.tools)
    uvicorn.run(served, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
