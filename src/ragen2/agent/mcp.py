"""The tools of a local MCP server (``env.tools: ["mcp:<command>"]``), started over stdio with fastmcp.

The runner is synchronous and MCP clients are async: the client's session lives in a task on an event loop of
its own (a daemon thread), opened and closed by that one task (anyio's scopes must be), and each tool call is
a coroutine handed to that loop. A call's wait runs under ``env.step_timeout_s`` like any tool
(``ragen2.agent.tools.run_call``); a call the server leaves unanswered is abandoned on the loop. The server's
stderr goes to /dev/null (a tool that raises would print its traceback on every call); a server that does not
start is a ``ConfigError`` at start-up. The server stops when the process exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shlex
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ragen2.errors import ConfigError

T = TypeVar("T")
#: seconds a server may take to start and list its tools (importing fastmcp alone takes a few)
START_TIMEOUT_S = 120.0


class McpSession:
    """One MCP server over stdio, its client session held open until ``close``."""

    def __init__(self, command: str, where: str) -> None:
        try:
            from fastmcp import Client
            from fastmcp.client.transports import StdioTransport
        except ImportError:
            raise ConfigError(
                f"{where} needs fastmcp. Fix: pip install fastmcp==4.2.3 (ragen2's mcp extra)"
            ) from None
        argv = shlex.split(command)
        self._devnull = open(os.devnull, "w")  # noqa: SIM115 (held open for the server's life)
        self.client = Client(StdioTransport(argv[0], argv[1:], log_file=self._devnull))
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="ragen2-mcp", daemon=True).start()
        self._opened = threading.Event()
        self._closing = asyncio.Event()
        self._held = asyncio.run_coroutine_threadsafe(self._hold(), self._loop)
        if not self._opened.wait(START_TIMEOUT_S) or self._held.done():
            why = "no answer" if not self._held.done() else repr(self._held.exception())
            self.close()
            raise ConfigError(
                f"{where}: the MCP server did not start ({why}). Fix: a command that runs an MCP server over "
                "stdio (try it in a shell), or remove it from env.tools"
            )
        atexit.register(self.close)

    async def _hold(self) -> None:
        async with self.client:
            self._opened.set()
            await self._closing.wait()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro`` run on the session's loop; the caller waits (and a timeout interrupts the wait)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def schemas(self) -> list[dict[str, Any]]:
        """The server's tools as OpenAI-style function schemas (their input schemas as the parameters)."""
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description or "",
                    "parameters": t.input_schema,
                },
            }
            for t in self.run(self.client.list_tools())
        ]

    def caller(self, name: str) -> Callable[..., str]:
        """The server's tool ``name`` as a function of its arguments, returning its text (raising its error)."""

        def call(**arguments: Any) -> str:
            result = self.run(self.client.call_tool(name, arguments, raise_on_error=False))
            text = "\n".join(str(getattr(c, "text", c)) for c in result.content)
            if result.is_error:  # the server caught what the tool raised: raise it here (rollout/tool_errors)
                raise RuntimeError(text)
            return text

        return call

    def close(self) -> None:
        if self._devnull.closed:
            return
        self._loop.call_soon_threadsafe(self._closing.set)
        with contextlib.suppress(Exception):  # a server that died or never started: nothing left to close
            self._held.result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._devnull.close()
