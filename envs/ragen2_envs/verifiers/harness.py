"""ragen2's seat in a verifiers episode: a harness (verifiers 0.4's program that plays a seat) that asks the
model once per segment, in process.

verifiers' own harnesses run a program in a runtime (a uv script in a subprocess, a container, a sandbox) that
calls the model through the rollout's interception endpoint, which records each turn on the trace. This one
makes that call itself, on the episode's event loop, as verifiers allows ("a harness may run its loop
in-process …, as long as every model call goes through ``endpoint`` + ``secret``"): one chat completion on the
segment's messages, no tools. A later segment (the env's next user turn) replays the conversation, as
verifiers' chat programs do (``SUPPORTS_RESUME``). ``ragen2_envs.verifiers.env`` names it for every seat it
fills, under the id ``ragen2-policy``.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import httpx
import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.runtimes import ProgramResult

__all__ = ["PolicyHarness"]


@functools.cache
def _http(loop: asyncio.AbstractEventLoop) -> httpx.AsyncClient:
    """One client per event loop: building one costs an SSL context (tens of ms), more than a turn's round
    trip."""
    return httpx.AsyncClient(timeout=None)  # the env's turn_timeout_s bounds the wait, not the client


class PolicyHarnessConfig(vf.HarnessConfig):
    pass


class PolicyHarness(vf.Harness[PolicyHarnessConfig]):
    """One chat completion per segment, through the rollout's interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
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
        reply = await _http(asyncio.get_running_loop()).post(
            f"{endpoint}/chat/completions",
            json={"model": ctx.model, "messages": messages},
            headers={"Authorization": f"Bearer {secret}"},
        )
        # a refused call is this program failing (verifiers records the error on the trace)
        failed = reply.status_code != 200
        return ProgramResult(exit_code=int(failed), stdout="", stderr=reply.text[-2000:] if failed else "")
