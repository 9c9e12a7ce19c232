"""An OpenEnv server's environment (openenv-core 0.3.0: its async client over a WebSocket) as a ragen2 environment.

One env holds one session of the server (OpenEnv gives each connection an environment instance of its own),
opened at the first ``reset`` and kept across episodes. ``reset(seed)`` and ``step(action)`` go to the server,
which answers with an observation: ``done``, ``reward`` and its own fields. The agent's ``<answer>`` goes in the
action's field ``action_key``; the policy is shown the observation's field ``observation_key`` (every field, as
JSON, when that is null). The client is OpenEnv's own (``GenericEnvClient``), run on an event loop of its own
thread, so the env stays a synchronous gymnasium env wherever it is called from (a notebook's running loop
included); ``message_timeout_s`` is the client's wait for each answer, the env's step timeout.

What the method needs of it:

* K rollouts of one seed see one prompt, byte for byte: the seed sent to the server is drawn from
  ``np_random``. The rollout's index goes along as ``sample``: a server whose ``reset`` takes it (ragen2's own
  served envs, ``ragen2_envs.openenv.server``) draws its per-step noise from it, and OpenEnv drops an argument
  a server's ``reset`` does not take.
* ``success`` is a flag apart from the return: the observation's field (or metadata key) ``success_key`` where
  the server sends one; else a done episode, not truncated, whose rewards sum to at least ``success_return``.
* The reasoning span is the agent's own (``<think>…</think><answer>…</answer>``); the server sees the answer.

Where it departs from OpenEnv, so that nothing a server does ends a run:

* An action the server refuses (OpenEnv's error answer: a payload its action model rejects, an exception in its
  ``step``) changes nothing here: an invalid action, reward 0, the episode goes on.
* A server that does not answer within ``message_timeout_s``, or drops the connection (it died), ends the
  episode: truncated, reward 0, ``info["env_error"]`` saying what happened, logged as an error and counted
  (``server_errors``, by URL). The next ``reset`` opens a new session.
* openenv-core 0.3.0's server leaves ``metadata`` out of what it sends (``serialize_observation``), so success,
  validity and truncation travel as observation fields where a server wants them read; a reward of None is 0.

A URL where no server answers is a ``ValueError`` at construction naming ``env.kwargs.base_url``, which
``ragen2-train`` reports at start-up in one line.

An OpenEnv MCP environment (actions ``list_tools`` and ``call_tool``) runs in ragen2's tool mode: under
``env.tools=['*']`` its tools are what ``list_tools`` reports at start-up, and each call goes to the server as
``call_tool`` on the episode's session (``call_tool``), its answer a step of the env (reward, done, success as
above). A call the server refuses is an error message to the policy; a server that fails ends the episode.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import os
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, TypeVar

from ragen2_envs.adapters import AnyText, bounded, event_loop, finite, on_loop, require
from ragen2_envs.base import EnvStep, TextEnv
from ragen2_envs.options import Range

#: the id as conf/env/openenv.yaml names it (importing ragen2_envs.openenv registers it)
ENV_ID = "ragen2_envs.openenv:ragen2/OpenEnv-v0"
# openenv-core's own requirements bring gradio (its web UI, which would move pillow back a major version):
# the client and the server need only what ragen2 has, and fastmcp
INSTALL = "pip install --no-deps openenv-core==0.3.0 && pip install fastmcp==4.2.3"
require("openenv", ENV_ID, INSTALL)
GenericEnvClient: Any = require("openenv.core.generic_client", ENV_ID, INSTALL).GenericEnvClient
httpx: Any = require("httpx", ENV_ID, INSTALL)  # openenv-core's own HTTP client

log = logging.getLogger(__name__)
T = TypeVar("T")
#: the servers' failures that ended an episode in this process, by base_url
server_errors: collections.Counter[str] = collections.Counter()
# what a reply is read for besides the text (a ragen2 env's info keys, as its served observation carries them)
VALID_KEY, TRUNCATED_KEY = "action_is_valid", "truncated"
# the system prompt's task text for a server that describes its env nowhere
GENERIC_INSTRUCTIONS = (
    "You are acting in an environment served over OpenEnv. Each turn, read its latest observation and give one "
    "action as your answer."
)
# added to the client's own limits when waiting on its loop: its timeouts fire first, this is a backstop
_SLACK_S = 5.0


class ServerRefused(Exception):
    """The server answered with OpenEnv's error message (``code: message``)."""


class _Client(GenericEnvClient):
    """OpenEnv's client, raising ``ServerRefused`` for the server's error answer (0.3.0 raises a bare
    ``RuntimeError``), so that a refused action is told apart from a failed connection."""

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        await self._send(message)
        response = await self._receive()
        if response.get("type") == "error":
            data = response.get("data") or {}
            raise ServerRefused(f"{data.get('code', 'UNKNOWN')}: {data.get('message', '')}")
        return response


def _said(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"


@functools.cache
def _description(base_url: str, timeout_s: float) -> str | None:
    """What the server at ``base_url`` says its environment is (its ``/metadata``), once it has answered its
    ``/health``; a ``ValueError`` naming ``env.kwargs.base_url`` where it does not answer."""
    http = base_url.replace("ws", "http", 1) if base_url.startswith("ws") else base_url
    try:
        httpx.get(f"{http.rstrip('/')}/health", timeout=timeout_s).raise_for_status()
    except httpx.HTTPError as err:
        raise ValueError(
            f"env.kwargs.base_url={base_url!r} does not answer ({_said(err)}): no OpenEnv server runs there. "
            "Start it first (e.g. python -m ragen2_envs.openenv.server ragen2/FrozenLake-v0 --port 8000), or "
            "point env.kwargs.base_url at one that runs"
        ) from None
    try:
        described = httpx.get(f"{http.rstrip('/')}/metadata", timeout=timeout_s).json().get("description")
    except (httpx.HTTPError, ValueError, AttributeError):  # /metadata is optional to a server
        return None
    return described if isinstance(described, str) and described.strip() else None


@dataclass(frozen=True)
class Url:
    """An http(s):// or ws(s):// URL."""

    def problem(self, value: Any) -> str | None:
        scheme, sep, rest = str(value).partition("://")
        if sep and scheme in ("http", "https", "ws", "wss") and rest.strip("/"):
            return None
        return "is not the http:// or ws:// URL of an OpenEnv server (e.g. http://localhost:8000)"


class OpenEnvEnv(TextEnv):
    """The environment an OpenEnv server at ``base_url`` serves, one session per env."""

    # OpenEnv's done ends an episode; 10 turns cover FrozenLake and games of that size, env.max_turns sets another
    default_max_turns: ClassVar[int] = 10
    # one action per turn: the solver's plan for several would step a copy of the env, and a session has none
    default_max_actions_per_turn: ClassVar[int] = 1

    def __init__(
        self,
        base_url: Annotated[str, Url()] = "http://localhost:8000",
        action_key: str = "message",
        observation_key: str | None = "text",
        success_key: str | None = "success",
        success_return: Annotated[float, Range(0.0, low_open=True)] = 1.0,
        oracle_key: str | None = "oracle",
        instructions: str | None = None,
        message_timeout_s: Annotated[float, Range(0.0, low_open=True)] = 30.0,
        connect_timeout_s: Annotated[float, Range(0.0, low_open=True)] = 10.0,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(render_mode=render_mode)
        self.observation_space = AnyText()
        self.action_space = AnyText()
        self.client: Any = None  # the session, opened by the first reset
        self.base_url = base_url
        self.action_key, self.observation_key = action_key, observation_key
        self.success_key, self.success_return = success_key, float(success_return)
        self.oracle_key = oracle_key
        self.message_timeout_s, self.connect_timeout_s = float(message_timeout_s), float(connect_timeout_s)
        described = _description(base_url, self.connect_timeout_s)
        self._instructions = instructions or described or GENERIC_INSTRUCTIONS
        self.text, self.earned, self.over = "", 0.0, False
        self.error: str | None = None  # why the server failed this episode
        self._key_missing_said = False

    @property
    def instructions(self) -> str:
        return self._instructions

    def render_state(self) -> str:
        return bounded(self.text)[0]

    # ---- the session -----------------------------------------------------------------------------
    def _ask(self, request: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        """One request on this env's session, opened first where there is none."""
        if self.client is None:
            self.client = _Client(
                base_url=self.base_url,
                connect_timeout_s=self.connect_timeout_s,
                message_timeout_s=self.message_timeout_s,
            )
        return on_loop(request(self.client), self.connect_timeout_s + self.message_timeout_s + _SLACK_S)

    def _ask_anew(self, request: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        """``_ask``, once more on a new session where the kept one fails at once (the server restarted between
        episodes); a refusal or a timeout is the server's answer, not asked again."""
        reused = self.client is not None
        try:
            return self._ask(request)
        except (ServerRefused, TimeoutError):
            raise
        except Exception:
            if not reused:
                raise
            self._drop()
            return self._ask(request)

    def _drop(self) -> None:
        """Let the session go without waiting on the server (which may be gone)."""
        client, self.client = getattr(self, "client", None), None
        if client is not None:
            asyncio.run_coroutine_threadsafe(client.close(), event_loop(os.getpid()))

    def _lost(self, err: BaseException, when: str) -> str:
        """End the episode on a server failure: logged, counted, the session dropped; what ``env_error`` says."""
        message = f"the OpenEnv server at {self.base_url} failed {when} ({_said(err)})"
        server_errors[self.base_url] += 1
        log.error(
            "%s; the episode ends as a failure (info['env_error']; %d such failures of this server so far)",
            message,
            server_errors[self.base_url],
        )
        self._drop()
        self.error, self.over = message, True
        return message

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            try:
                on_loop(client.close(), self.connect_timeout_s + _SLACK_S)
            except Exception as err:  # a server already gone has no session left to close
                log.debug("closing the session of %s: %s", self.base_url, _said(err))

    def __del__(self) -> None:
        with contextlib.suppress(RuntimeError):  # at interpreter exit the loop may have gone first
            self._drop()

    # ---- the episode -----------------------------------------------------------------------------
    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        seed = int(self.np_random.integers(2**31))
        sample = int(options.get("sample", 0))
        self.text, self.earned, self.over, self.error = "", 0.0, False, None
        try:
            result = self._ask_anew(lambda client: client.reset(seed=seed, sample=sample))
        except Exception as err:
            failed = self._lost(err, "at reset")
            self.text = f"(The environment did not respond: {failed}.)"
            return {"seed": seed, "env_error": failed}
        self._read(result)
        return {"seed": seed, "observation_cut": bounded(self.text)[1]}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        if (
            self.error is not None
        ):  # the server failed this episode at reset: it ends here, as no fault of the policy
            return 0.0, False, True, {"env_error": self.error}
        if self.over:
            return 0.0, False, False, {"action_is_valid": False}
        try:
            result = self._ask(lambda client: client.step({self.action_key: action}))
        except ServerRefused as err:
            return 0.0, False, False, {"action_is_valid": False, "server_refused": str(err)[:200]}
        except Exception as err:
            return 0.0, False, True, {"env_error": self._lost(err, "mid-episode")}
        return self._read(result)

    def _read(self, result: Any) -> tuple[float, bool, bool, dict[str, Any]]:
        """The reply's text (to ``self.text``), reward, terminated, truncated and info."""
        self.text = self._text(_fields(result))
        return self._outcome(result)

    def _outcome(self, result: Any) -> tuple[float, bool, bool, dict[str, Any]]:
        """The reply's reward, terminated, truncated and info."""
        fields = _fields(result)
        metadata = fields.get("metadata") if isinstance(fields.get("metadata"), Mapping) else {}

        def field(key: str | None) -> Any:
            return None if key is None else fields.get(key, metadata.get(key))

        reward, is_finite = (0.0, True) if result.reward is None else finite(result.reward)
        self.earned += reward
        done = bool(result.done)
        truncated = done and bool(field(TRUNCATED_KEY))
        terminated = done and not truncated
        flag = field(self.success_key)
        success = bool(flag) if flag is not None else terminated and self.earned >= self.success_return
        valid = field(VALID_KEY)
        self.over = done
        info = {
            "success": success,
            "action_is_valid": valid is None or bool(valid),
            "reward_invalid": not is_finite,
        }
        return reward, terminated, truncated, info

    def _text(self, fields: Mapping[str, Any]) -> str:
        """The observation's ``observation_key`` field, or all its fields as JSON (not the metadata: a server
        that sends it means it for the trainer)."""
        key = self.observation_key
        if key is not None and key in fields:
            shown = fields[key]
            return shown if isinstance(shown, str) else json.dumps(shown, sort_keys=True, ensure_ascii=False)
        if key is not None and not self._key_missing_said:
            self._key_missing_said = True
            log.warning(
                "the observations of %s have no field %r (they have %s): the policy is shown every field as JSON. "
                "Fix: env.kwargs.observation_key=<the field that holds the text>",
                self.base_url,
                key,
                ", ".join(sorted(fields)) or "none",
            )
        shown = {k: v for k, v in fields.items() if k != "metadata"}
        return json.dumps(shown, sort_keys=True, ensure_ascii=False, default=str)

    # ---- tools (env.tools=["*"]) ------------------------------------------------------------------
    def list_tools(self) -> list[dict[str, Any]]:
        """The tools the server lists (an OpenEnv MCP environment's ``list_tools``) as OpenAI-style function
        schemas; a ``ValueError`` naming ``env.kwargs.base_url`` where it lists none."""
        hint = (
            "Fix: point env.kwargs.base_url at an MCP environment (e.g. python -m ragen2_envs.openenv.server "
            "ragen2/SearchQA-v0 --tools), or leave env.tools empty"
        )
        try:
            result = self._ask_anew(lambda client: client.step({"type": "list_tools"}))
        except ServerRefused as err:
            raise ValueError(
                f"env.kwargs.base_url={self.base_url!r} does not list tools ({err}). {hint}"
            ) from None
        tools = _fields(result).get("tools")
        if not isinstance(tools, list) or not tools:
            raise ValueError(f"env.kwargs.base_url={self.base_url!r} lists no tools. {hint}")
        return [
            {
                "type": "function",
                "function": {
                    "name": str(tool.get("name", "")),
                    "description": str(tool.get("description") or ""),
                    "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
                },
            }
            for tool in tools
            if isinstance(tool, Mapping)
        ]

    def call_tool(self, name: str, **arguments: Any) -> EnvStep:
        """One call of the server's tool ``name`` (OpenEnv's ``call_tool``): its text and the step it made (the
        reply's reward, done and fields, as for an action). A call the server could not run (an unknown tool,
        arguments its schema refuses, a tool that raised) raises with the server's message, which the policy is
        shown; a server that fails ends the episode, as at ``step``."""
        if self.error is not None:
            return EnvStep(
                f"The environment did not respond: {self.error}.",
                truncated=True,
                info={"env_error": self.error},
            )
        if self.over:
            return EnvStep("The episode is over.", info={"action_is_valid": False})
        call = {"type": "call_tool", "tool_name": name, "arguments": arguments}
        try:
            result = self._ask(lambda client: client.step(call))
        except ServerRefused as err:
            raise RuntimeError(str(err)) from None
        except Exception as err:
            failed = self._lost(err, "mid-episode")
            return EnvStep(
                f"The environment did not respond: {failed}.", truncated=True, info={"env_error": failed}
            )
        fields = _fields(result)
        error = fields.get("error")
        if error:
            raise RuntimeError(str(error.get("message", error)) if isinstance(error, Mapping) else str(error))
        reward, terminated, truncated, info = self._outcome(result)
        return EnvStep(bounded(_result_text(fields.get("result")))[0], reward, terminated, truncated, info)

    def oracle_action(self) -> str | None:
        """A known-good next action, where the server's state carries one in its field ``oracle_key`` (ragen2's
        own served envs do: ``oracle``)."""
        if self.oracle_key is None or self.over or self.client is None:
            return None
        try:
            state = self._ask(lambda client: client.state())
        except Exception as err:  # the next step meets the failure and ends the episode
            log.debug("the state of %s: %s", self.base_url, _said(err))
            return None
        action = state.get(self.oracle_key) if isinstance(state, Mapping) else None
        return action if isinstance(action, str) else None


def _fields(result: Any) -> Mapping[str, Any]:
    """A reply's observation fields (none where the server sent no mapping)."""
    return result.observation if isinstance(result.observation, Mapping) else {}


def _result_text(result: Any) -> str:
    """An MCP tool result's text: its text contents joined, else its data, else the whole as JSON."""
    if isinstance(result, str):
        return result
    if isinstance(result, Mapping):
        texts = [
            c["text"]
            for c in result.get("content") or ()
            if isinstance(c, Mapping) and isinstance(c.get("text"), str)
        ]
        if texts:
            return "\n".join(texts)
        if isinstance(result.get("data"), str):
            return result["data"]
    return json.dumps(result, sort_keys=True, ensure_ascii=False, default=str)
