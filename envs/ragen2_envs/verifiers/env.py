"""verifiers 0.4.0's environments (a taskset, the ``Env`` that plays it, its rubric) as ragen2 environments.

verifiers 0.4 has no reset/step: ``Env.run_episode(task, ctx)`` plays a whole episode, and its seats reach the
model as an OpenAI-compatible endpoint (``ctx.client``) through verifiers' interception server, which records
each turn on the episode's trace. The adapter inverts that control. Each episode runs on an event loop of its
own thread (``adapters.on_loop``), with ragen2's policy behind the endpoint (``_Policy``: a chat-completions
route on localhost); a request to it waits there until ragen2 answers. ``reset`` starts the episode and
returns when verifiers first asks the model; ``step`` answers that request with the agent's answer and returns
at verifiers' next request (the env's next user turn) or at the episode's end, whose rubric is the reward: the
weighted sum of the task's ``@vf.reward`` functions (and judges) on the seat's trace, ``trace.reward``. Each
seat plays through ``harness.py`` (in-process chat calls) in verifiers' subprocess runtime.

A task with tool servers (``Task.toolsets``) runs in ragen2's tool mode (``env.tools=['*']``): the harness offers
the servers' tools in each request, ``list_tools`` reads them off an episode's first request, and ``call_tool``
answers the waiting request with a reply that calls the tool; the harness runs it on the server and asks again
with its result, which is the call's text (a result the harness marks ``ERROR`` raises as the tool's error).

What the method needs of it:

* K rollouts of one seed see one prompt, byte for byte: the task is drawn from ``np_random`` among the
  taskset's first ``max_tasks``; verifiers' system message is the env's ``instructions``, and the observation
  is the text of the messages after the model's last reply (the task's prompt, then each user turn the env
  sends).
* Token in, token out: ragen2 renders its prompt ids from that text and keeps the ids it sampled; verifiers
  gets the answer's text as the assistant's reply and tokenizes nothing for ragen2.
* ``success`` is a flag apart from the shaped return: an episode verifiers ended cleanly (no error, no
  deadline of its own) whose return is at least ``success_threshold``.
* The step timeout: ``turn_timeout_s`` bounds each wait on verifiers (its env code, its scoring); past it the
  episode ends as a logged, counted failure (``info["env_error"]``), as does an episode verifiers ends on an
  error.
* The reasoning span is the agent's own (``<think>…</think><answer>…</answer>``); verifiers sees the answer.

Where it departs from verifiers: a blank answer is an invalid action (the request keeps waiting), not a reply;
one rollout of an episode plays ragen2's policy (the first to ask): another that asks it (best-of-n's second
attempt, user-sim's user) is refused, its trace failing, logged and counted (``problems``), while the first is
scored. A seat that pins a harness of its own keeps it (verifiers' programs need uv or a container, not here).
verifiers 0.4 finds a taskset, an ``Env`` and a harness only as a module named by its id (``gsm8k`` is
``import gsm8k``): ragen2's own (``PLUGINS``) are put in ``sys.modules`` under theirs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import importlib
import importlib.util
import json
import logging
import os
import sys
import uuid
from collections.abc import Collection, Iterator, Mapping
from typing import Annotated, Any, ClassVar

from ragen2_envs.adapters import AnyText, bounded, event_loop, finite, on_loop, require
from ragen2_envs.base import EnvStep, TextEnv
from ragen2_envs.options import Named, Range

#: the id as conf/env/verifiers.yaml names it (importing ragen2_envs.verifiers registers it)
ENV_ID = "ragen2_envs.verifiers:ragen2/Verifiers-v0"
# verifiers 0.4.0's own pins would move ours back (mcp 2.3 to 2.0, openai 3 to 2), and its prime-runs,
# prime-tunnel and gepa serve hosted runs, tunnels and prompt search: its import needs only these
# (scripts/install.sh)
INSTALL = (
    "pip install prime-sandboxes==0.5.1 math-verify==0.9.0 tomli-w==1.2.0 && pip install --no-deps "
    "verifiers==0.4.0 prime-pydantic-config==0.4.3 renderers==0.1.12"
)
require("verifiers", ENV_ID, INSTALL)
vf: Any = require("verifiers.v1", ENV_ID, INSTALL)
web: Any = require("aiohttp.web", ENV_ID, INSTALL)  # verifiers' own server library
SESSION_HEADER: str = require("verifiers.v1.clients.client", ENV_ID, INSTALL).SESSION_ID_HEADER
ERROR: str = importlib.import_module("ragen2_envs.verifiers.harness").ERROR

log = logging.getLogger(__name__)

#: ragen2's own verifiers plugins, by id: the seat's harness and two example environments
PLUGINS = {
    "ragen2-policy": "ragen2_envs.verifiers.harness",
    "ragen2-arithmetic": "ragen2_envs.verifiers.arithmetic",
    "ragen2-guess": "ragen2_envs.verifiers.guess",
    "ragen2-lookup": "ragen2_envs.verifiers.lookup",
}
HARNESS = "ragen2-policy"
EXAMPLES = ("ragen2-arithmetic", "ragen2-guess", "ragen2-lookup")
#: what went wrong on verifiers' side in this process, by kind (episode_error, turn_timeout, second_seat,
#: reward_invalid, observation_cut)
problems: collections.Counter[str] = collections.Counter()
# the system prompt's task text for an episode whose verifiers prompt has no system message
GENERIC_INSTRUCTIONS = "Answer the user's latest message; your answer is sent as your reply."
# verifiers logs each rollout's start and end at INFO: quiet unless someone asked for them
if logging.getLogger("verifiers").level == logging.NOTSET:
    logging.getLogger("verifiers").setLevel(logging.WARNING)


def _module(plugin_id: str) -> str:
    """The module verifiers imports for a plugin id (``owner/name@version`` installs as ``name``)."""
    return plugin_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


for _id, _path in PLUGINS.items():
    sys.modules.setdefault(_module(_id), importlib.import_module(_path))


class _Tasksets(Collection[str]):
    """The verifiers taskset ids that import here: ragen2's examples, verifiers' own and any installed package
    (a name that does not import is not one; the examples are the names offered in its place)."""

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str) or not name.strip():
            return False
        module = _module(name)
        try:
            return any(importlib.util.find_spec(m) for m in (f"verifiers.v1.tasksets.{module}", module))
        except (ImportError, ValueError):  # a dotted name whose parent does not import
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(EXAMPLES)

    def __len__(self) -> int:
        return len(EXAMPLES)


#: a verifiers taskset that imports here
TASKSET = Named(
    _Tasksets(),
    "a verifiers taskset installed here",
    f"a taskset is a package that imports as its id: pip install it; {EXAMPLES[0]} (single-turn) and "
    f"{EXAMPLES[1]} (multi-turn) and {EXAMPLES[2]} (tools) ship with ragen2",
)


# ---- ragen2's policy as an endpoint on the adapters' event loop -----------------------------------------
#: ragen2's reply to a request: an assistant message (a text, or a tool call), None once ragen2 has left
Reply = dict[str, Any] | None


def _said(text: str) -> dict[str, Any]:
    """The assistant's reply ``text``."""
    return {"role": "assistant", "content": text}


def _calls(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant's reply that calls the tool ``name`` (OpenAI's ``tool_calls``)."""
    call = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(dict(arguments), ensure_ascii=False)},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _completion(message: dict[str, Any], model: str) -> dict[str, Any]:
    """An OpenAI chat completion whose one choice is ``message``."""
    done = "tool_calls" if message.get("tool_calls") else "stop"
    choice = {"index": 0, "message": message, "finish_reason": done}
    return {
        "id": f"ragen2-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [choice],
    }


def _refusal(message: str, status: int) -> Any:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


class _Episode:
    """One verifiers episode on the loop; its requests to the policy wait in ``asks`` for ragen2's answers."""

    def __init__(self, env: Any, task: Any, ctx: Any) -> None:
        self.asks: asyncio.Queue[tuple[list[Any], asyncio.Future[Reply]]] = asyncio.Queue()
        self.reply: asyncio.Future[Reply] | None = None  # the request waiting for ragen2's answer
        self.seat: str | None = None  # the trace id of the seat that plays ragen2's policy (the first to ask)
        self.tools: list[Any] = []  # the tools the seat's requests offer the model (its task's tool servers)
        self.run: asyncio.Future[Any] = asyncio.ensure_future(env.run_episode(task, ctx))

    async def ask(self, session: str | None, body: Mapping[str, Any]) -> Any:
        """A request of this episode's seat: its answer once ragen2 gives it."""
        self.seat = self.seat or session
        if session != self.seat:
            _note("second_seat", f"a second seat of one episode asked ragen2's policy (trace {session})")
            return _refusal("ragen2's policy plays one seat of an episode; pin this seat's client", 400)
        reply: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        messages, tools = body.get("messages"), body.get("tools")
        self.tools = tools if isinstance(tools, list) else []
        await self.asks.put((messages if isinstance(messages, list) else [], reply))
        message = await reply
        if message is None:
            return _refusal("ragen2 has left this episode", 409)
        return web.json_response(_completion(message, str(body.get("model"))))

    async def next(self, answer: Reply) -> list[Any] | None:
        """Answer the waiting request with ``answer`` (None: none waits, or the first request); the next
        request's messages, or None once the episode has ended."""
        if answer is not None and self.reply is not None and not self.reply.done():
            self.reply.set_result(answer)
        self.reply = None
        asked = asyncio.ensure_future(self.asks.get())
        try:
            await asyncio.wait({asked, self.run}, return_when=asyncio.FIRST_COMPLETED)
            if not asked.done():
                return None
            messages, self.reply = asked.result()
            return messages
        finally:
            asked.cancel()  # no-op once it has its request

    def cancel(self) -> None:
        """Stop the episode; each request still waiting is refused."""
        waiting = [self.reply] + [self.asks.get_nowait()[1] for _ in range(self.asks.qsize())]
        for reply in waiting:
            if reply is not None and not reply.done():
                reply.set_result(None)
        self.run.cancel()


class _Policy:
    """ragen2's policy as an OpenAI-compatible chat endpoint on localhost; a request's ``model`` names its
    episode (verifiers imposes the episode's model on every request), so one endpoint, and one verifiers
    client, serve all."""

    def __init__(self) -> None:
        self.episodes: dict[str, _Episode] = {}
        self.url = ""

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", self.complete)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"

    async def complete(self, request: Any) -> Any:
        body = await request.json()
        episode = self.episodes.get(str(body.get("model"))) if isinstance(body, dict) else None
        if episode is None:  # an episode ragen2 has left (reset, closed): nobody answers it
            return _refusal("no ragen2 episode is waiting for this model", 404)
        return await episode.ask(request.headers.get(SESSION_HEADER), body)

    async def open(self, env: Any, task: Any) -> tuple[str, _Episode]:
        key = f"ragen2/{uuid.uuid4().hex}"  # routes requests only: the prompt never shows it
        # any key variable but verifiers' default PRIME_API_KEY, which would read the Prime CLI's config
        client = vf.EvalClientConfig(base_url=self.url, api_key_var="RAGEN2_VERIFIERS_API_KEY")
        episode = self.episodes[key] = _Episode(env, task, vf.ModelContext(model=key, client=client))
        return key, episode


@functools.cache
def _policy(pid: int) -> _Policy:
    policy = _Policy()
    on_loop(policy.start(), 30.0)
    return policy


def _note(kind: str, message: str) -> None:
    """Count one problem on verifiers' side, logged at its first time in this process."""
    problems[kind] += 1
    (log.warning if problems[kind] == 1 else log.debug)("%s (%s, %d so far)", message, kind, problems[kind])


# ---- a verifiers Env, served for the process -------------------------------------------------------------
def _config(
    taskset: str, env: str | None, taskset_config: Mapping[str, Any], env_config: Mapping[str, Any]
) -> Any:
    """verifiers' config of the environment: each seat without a harness of its own played by ragen2's, every
    seat in verifiers' subprocess runtime (its default runtime is a remote sandbox)."""
    cls = vf.env_config_type(taskset, env or "")
    seats = {
        name: {
            "runtime": {"type": "subprocess"},
            **({"harness": {"id": HARNESS}} if field.default.harness is None else {}),
            **env_config.get(name, {}),
        }
        for name, field in cls.model_fields.items()
        if isinstance(field.default, vf.AgentConfig)
    }
    return vf.resolve_env_config(
        {**env_config, **seats, "id": env or "", "taskset": {**taskset_config, "id": taskset}}
    )


@functools.cache
def _served(
    pid: int, taskset: str, env: str | None, settings: str, max_tasks: int
) -> tuple[Any, tuple[Any, ...], contextlib.AsyncExitStack]:
    """The verifiers Env of these settings and its first ``max_tasks`` tasks, its serving resources
    (interception, shared tools) held open on process ``pid``'s loop: one per settings, shared by every env
    made from them."""
    taskset_config, env_config = json.loads(settings)
    try:
        served = vf.load_environment(_config(taskset, env, taskset_config, env_config))
        tasks = tuple(served.taskset.take(max_tasks))
    # a plugin that does not load, config fields it refuses, a taskset that needs a download
    except Exception as err:
        said = " ".join(str(err).split())[:300]
        given = f"env={env!r}, taskset_config={taskset_config}, env_config={env_config}"
        raise ValueError(
            f"taskset={taskset!r} ({given}) does not start here ({type(err).__name__}: {said}); offline: "
            f"{', '.join(EXAMPLES)}"
        ) from None
    if not tasks:
        raise ValueError(f"taskset={taskset!r} with taskset_config={taskset_config} has no tasks")
    held = contextlib.AsyncExitStack()  # kept with the env: collected, it would close the serving context
    on_loop(held.enter_async_context(served.serving()), 60.0)
    return served, tasks, held


def _text(content: Any) -> str:
    """A message's text (a list of content parts: its text parts; images and files have none)."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


class VerifiersEnv(TextEnv):
    """One verifiers environment: the tasks of ``taskset``, played by its own ``Env`` (or ``env``'s)."""

    # the env ends the exchange; ragen2-guess takes up to 4 turns, env.max_turns sets another limit
    default_max_turns: ClassVar[int] = 4
    default_max_actions_per_turn: ClassVar[int] = 1

    def __init__(
        self,
        taskset: Annotated[str, TASKSET] = "ragen2-arithmetic",
        env: str | None = None,
        taskset_config: dict[str, Any] | None = None,
        env_config: dict[str, Any] | None = None,
        max_tasks: Annotated[int, Range(1)] = 10_000,
        success_threshold: Annotated[float, Range(0.0, low_open=True)] = 1.0,
        oracle_key: str | None = "answer",
        instructions: str | None = None,
        turn_timeout_s: Annotated[float, Range(0.0, low_open=True)] = 30.0,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(render_mode=render_mode)
        self.observation_space = AnyText()
        self.action_space = AnyText()
        self.taskset = taskset
        settings = json.dumps([taskset_config or {}, env_config or {}], sort_keys=True)
        self.served, self.tasks, _ = _served(os.getpid(), taskset, env, settings, max_tasks)
        self.success_threshold = float(success_threshold)
        self.oracle_key = oracle_key
        self._instructions = instructions
        self.turn_timeout_s = float(turn_timeout_s)
        self.task: Any = self.tasks[0]
        self.episode: _Episode | None = None
        self.key = ""
        self.text, self.system, self.over = "", None, False
        self.error: str | None = None  # why verifiers failed this episode

    @property
    def instructions(self) -> str:
        return self.system or self._instructions or GENERIC_INSTRUCTIONS

    def render_state(self) -> str:
        return self.text

    # ---- the episode -----------------------------------------------------------------------------
    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self._leave()
        index = int(self.np_random.integers(len(self.tasks)))
        self.task, self.text, self.system, self.over, self.error = self.tasks[index], "", None, False, None
        policy = _policy(os.getpid())
        self.key, self.episode = on_loop(policy.open(self.served, self.task), self.turn_timeout_s)
        _, _, _, info = self._advance(None, "before its first request")
        if self.error is not None:
            self.text = f"(The environment failed before its first turn: {self.error}.)"
        return {"taskset": self.taskset, "index": index, **info}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        # verifiers failed this episode at reset: it ends here, no fault of the policy
        if self.error is not None:
            return 0.0, False, True, {"env_error": self.error}
        if self.over or not action:
            return 0.0, False, False, {"action_is_valid": False}
        return self._advance(_said(bounded(action)[0]), "after a reply")

    def _advance(self, answer: Reply, when: str) -> tuple[float, bool, bool, dict[str, Any]]:
        """Answer verifiers' waiting request (if ``answer``), then read its next request or the episode's
        end."""
        assert self.episode is not None
        try:
            messages = on_loop(self.episode.next(answer), self.turn_timeout_s)
        except TimeoutError:
            return self._failed(
                "turn_timeout", f"gave no turn within turn_timeout_s={self.turn_timeout_s:g} s {when}"
            )
        except BaseException:  # ragen2's env.step_timeout_s (or an interrupt): this episode is abandoned
            self._leave()
            raise
        if messages is None:
            return self._ended()
        return 0.0, False, False, {"observation_cut": self._show(messages)}

    def _show(self, messages: list[Any]) -> bool:
        """The request's system text (the first request's) and the user's turn since the model's last reply,
        as the observation; whether it was cut to fit."""
        wire = [m for m in messages if isinstance(m, dict)]
        if self.system is None:
            system = "\n\n".join(
                _text(m.get("content")) for m in wire if m.get("role") in ("system", "developer")
            )
            self.system = bounded(system)[0] or None
        last = max((i for i, m in enumerate(wire) if m.get("role") == "assistant"), default=-1)
        shown = [_text(m.get("content")) for m in wire[last + 1 :] if m.get("role") in ("user", "tool")]
        self.text, cut = bounded("\n\n".join(shown))
        if cut:
            _note("observation_cut", f"a turn of {self.taskset} was longer than an observation holds: cut")
        return cut

    def _ended(self) -> tuple[float, bool, bool, dict[str, Any]]:
        """The episode's return and flags, read off the trace of the seat ragen2 played."""
        assert self.episode is not None
        result = self.episode.run.result()
        trace = next((t for t in result.traces if t.id == self.episode.seat), None)
        errors = [*result.errors, *(trace.errors if trace is not None else [])]
        self._leave()
        if trace is None or errors:
            last = errors[-1] if errors else None
            said = (
                f"{last.type}: {' '.join(last.message.split())[:200]}" if last else "no seat asked the policy"
            )
            return self._failed("episode_error", f"ended the episode on an error ({said})")
        reward, is_finite = finite(trace.reward)
        if not is_finite:
            _note("reward_invalid", f"the rubric of {self.taskset} gave {trace.reward!r}: counted as 0")
        truncated = bool(trace.is_timeout or result.is_timeout)  # a deadline of verifiers' own
        self.over = True
        success = not truncated and reward >= self.success_threshold
        return reward, not truncated, truncated, {"success": success, "reward_invalid": not is_finite}

    def _failed(self, kind: str, what: str) -> tuple[float, bool, bool, dict[str, Any]]:
        """End the episode on a failure of verifiers' side: logged, counted, truncated; ``env_error`` says
        it."""
        self._leave()
        problems[kind] += 1
        self.error, self.over = f"verifiers' {self.taskset} {what}", True
        log.error(
            "%s; the episode ends as a failure (info['env_error']; %d so far)", self.error, problems[kind]
        )
        return 0.0, False, True, {"env_error": self.error}

    def _leave(self) -> None:
        """Stop the running episode, if any, without waiting for it."""
        episode, self.episode = getattr(self, "episode", None), None
        if episode is not None:
            policy, key = _policy(os.getpid()), self.key

            def stop() -> None:
                policy.episodes.pop(key, None)
                episode.cancel()

            event_loop(os.getpid()).call_soon_threadsafe(stop)

    def close(self) -> None:
        self._leave()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the loop may have gone first
            self._leave()

    # ---- tools (env.tools=["*"]) ------------------------------------------------------------------
    def list_tools(self) -> list[dict[str, Any]]:
        """The tools the task's tool servers offer (OpenAI-style function schemas, as verifiers' requests to
        the model carry them), read off the first request of an episode; a ``ValueError`` naming the taskset
        where it offers none."""
        if self.episode is None:
            self.reset(seed=0)
        if self.error is not None:
            raise ValueError(
                f"env.kwargs.taskset={self.taskset!r} did not get as far as offering tools ({self.error}). Fix: "
                "a taskset and env that run here (try it without env.tools)"
            )
        tools = [
            t for t in (self.episode.tools if self.episode is not None else []) if isinstance(t, Mapping)
        ]
        if not tools:
            raise ValueError(
                f"env.kwargs.taskset={self.taskset!r} offers the policy no tools (its tasks have no tool "
                f"servers). Fix: a taskset whose tasks have toolsets (e.g. {EXAMPLES[2]}), or leave env.tools "
                "empty"
            )
        return [dict(t) for t in tools]

    def call_tool(self, name: str, **arguments: Any) -> EnvStep:
        """One call of the tool ``name``: the policy's reply that calls it goes to verifiers, whose harness runs
        it on the task's tool server; its result (the next request's tool message) is the call's text. A call the
        server refuses or whose tool raises raises here with the server's message, which the policy is shown;
        an episode verifiers ends instead is the step it made (its rubric's reward)."""
        if self.error is not None:
            return EnvStep(
                f"The environment failed: {self.error}.", truncated=True, info={"env_error": self.error}
            )
        if self.over or self.episode is None:
            return EnvStep("The episode is over.", info={"action_is_valid": False})
        reward, terminated, truncated, info = self._advance(_calls(name, arguments), "after a tool call")
        if terminated or truncated:
            return EnvStep("The episode is over.", reward, terminated, truncated, info)
        if self.text.startswith(ERROR):  # the harness's word for a call that failed: the tool's error
            raise RuntimeError(self.text[len(ERROR) :])
        return EnvStep(self.text, info=info)

    def oracle_action(self) -> str | None:
        """The task's known-good answer, where its data carries one in the field ``oracle_key`` (ragen2's
        examples: ``answer``); a multi-turn env whose first reply can be right (ragen2-guess) is solved by
        it."""
        value = getattr(self.task.data, self.oracle_key or "", None)
        if self.over or self.error is not None or isinstance(value, bool):
            return None
        return (str(value).strip() or None) if isinstance(value, str | int | float) else None
