"""ragen2's seat in a verifiers episode: a harness (verifiers 0.4's program that plays a seat) that asks the
model in process, with the task's tools.

verifiers' own harnesses run a program in a runtime (a uv script in a subprocess, a container, a sandbox) that
calls the model through the rollout's interception endpoint, which records each turn on the trace. This one
makes those calls itself, on the episode's event loop, as verifiers allows ("a harness may run its loop
in-process …, as long as every model call goes through ``endpoint`` + ``secret``"): a chat completion on the
segment's messages, offered the tools of the task's tool servers (``mcp_urls``, listed and called with
verifiers' own MCP client); a reply that calls tools gets their results as tool messages and the model is
asked again, until a reply calls none. A later segment (the env's next user turn) replays the conversation, as
verifiers' chat programs do (``SUPPORTS_RESUME``). ``ragen2_envs.verifiers.env`` names it for every seat it
fills, under the id ``ragen2-policy``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from typing import Any

import httpx
import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harnesses.utils.mcp import connect_mcp, mcp_content_to_chat_content
from verifiers.v1.runtimes import ProgramResult

__all__ = ["PolicyHarness"]

#: tool calls one segment may make before its harness gives up on it (a policy that never answers)
MAX_CALLS = 64
#: how a tool message says its call failed (the adapter raises it as the tool's error)
ERROR = "error: "


@functools.cache
def _http(loop: asyncio.AbstractEventLoop) -> httpx.AsyncClient:
    """One client per event loop: building one costs an SSL context (tens of ms), more than a turn's round
    trip."""
    return httpx.AsyncClient(timeout=None)  # the env's turn_timeout_s bounds the wait, not the client


class PolicyHarnessConfig(vf.HarnessConfig):
    pass


class PolicyHarness(vf.Harness[PolicyHarnessConfig]):
    """Chat completions through the rollout's interception endpoint, the task's tools run between them."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    SUPPORTS_MCP = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: Any,
        trace: Any,
        runtime: Any,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: Any,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [message_to_wire(message) for message in prompt or []]
        servers = {"mcpServers": {name: {"url": url} for name, url in mcp_urls.items()}}
        async with contextlib.AsyncExitStack() as held:
            tools, dispatch, clients = await connect_mcp(servers, held)  # none without servers
            for _ in range(MAX_CALLS + 1):
                reply = await _http(asyncio.get_running_loop()).post(
                    f"{endpoint}/chat/completions",
                    json={"model": ctx.model, "messages": messages, **({"tools": tools} if tools else {})},
                    headers={"Authorization": f"Bearer {secret}"},
                )
                # a refused call is this program failing (verifiers records the error on the trace)
                if reply.status_code != 200:
                    return ProgramResult(exit_code=1, stdout="", stderr=reply.text[-2000:])
                message = reply.json()["choices"][0]["message"]
                messages.append(message)
                calls = message.get("tool_calls") or []
                if not calls:
                    return ProgramResult(exit_code=0, stdout="", stderr="")
                for call in calls:
                    content = await _run_call(clients, dispatch, call["function"])
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        return ProgramResult(
            exit_code=1, stdout="", stderr=f"more than {MAX_CALLS} tool calls in one segment"
        )


async def _run_call(clients: dict[str, Any], dispatch: dict[str, Any], function: dict[str, Any]) -> Any:
    """One tool call's result for the model: the tool's content, or (``ERROR`` and) what kept it from running,
    as verifiers' harnesses tell a model."""
    name = function.get("name")
    if name not in dispatch:
        return f"{ERROR}unknown tool {name!r}"
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError as err:
        return f"{ERROR}the arguments are not JSON ({err})"
    server, tool = dispatch[name]
    try:  # through the connection as verifiers' call_mcp does, keeping the result's is_error, which it drops
        result = await clients[server].run(
            lambda client: client.call_tool(tool, arguments if isinstance(arguments, dict) else {})
        )
    except Exception as err:  # the server gone mid-episode: the model is told, the episode goes on
        return f"{ERROR}{type(err).__name__}: {err}"
    content = mcp_content_to_chat_content(result.content)
    return f"{ERROR}{content}" if result.is_error and isinstance(content, str) else content
