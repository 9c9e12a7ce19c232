"""The multi-turn episode runner (docs/method.md §7).

All active episodes of a collection are sampled together, one batched ``generate`` call per turn. The
agent owns the format: it parses ``<answer>``, splits on ``||``, keeps at most ``max_actions_per_turn``
actions and calls ``env.step`` once per action. A bad format or any invalid action costs the turn one
``format_penalty``; the episode goes on. Episodes end when the env terminates or truncates, at
``max_turns`` (truncated), or when the next turn would not fit ``max_context`` (truncated, never a crash).

Env calls (``reset``, ``step``, the solver's ``oracle_action``, its steps on a copy and its
``oracle_reasoning``) run under ``step_timeout_s`` (``ragen2.agent.timeout``). A call past it ends its
episode like a context truncation: truncated, ``end_reason="env_timeout"``, the return as it stood (no
penalty: the fault is the env's, not the policy's), the env discarded. The episode keeps its place in its group, so every group still holds
``group_size`` rows for the filter and the advantages; one that timed out before its first turn was sampled
holds one unsampled turn (its prompt, no tokens to train on, return 0). Each timeout is logged as a
warning and counted in ``rollout/env_timeouts``.

With tools (``env.tools``, ``ragen2.agent.tools``) a turn may call tools instead of writing ``<answer>``: the
calls run (at most ``max_actions_per_turn``, each under ``step_timeout_s``) and the next turn's prompt holds
their results as tool messages. A tool that moves the env (its ``EnvStep``) gives the turn its reward, success
and end as an action does.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ragen2.agent.call_formats import AUTO, call_format, check_format_name
from ragen2.agent.episode import ENV_TIMEOUT, Episode, Turn
from ragen2.agent.parsing import ACTION_SEP, parse_turn
from ragen2.agent.reasoning import reasoning_ids
from ragen2.agent.render import (
    THINK_CLOSE,
    Message,
    TurnRenderer,
    assistant_message,
    check_chat_template,
    check_tool_template,
    check_vocabulary,
    renderer_for,
)
from ragen2.agent.timeout import EnvTimeout, call_with_timeout
from ragen2.agent.tools import Toolbox, ToolCall, run_call, tool_turn
from ragen2.log import log
from ragen2.progress import bar
from ragen2.rollout.base import PromptMeta, Sampler, SamplingParams

FORMAT_RULE = (
    "Answer with your reasoning inside <think> </think>, then your action(s) inside <answer> </answer>, "
    "separated by || (at most {max_actions}). Keep the whole response under {max_tokens} tokens."
)
# the rule under env.tools: the template's system prompt shows the tools and how to call them
TOOL_RULE = (
    "Answer with your reasoning inside <think> </think>, then either call tools (at most {max_actions}) or give "
    "your action(s) inside <answer> </answer>, separated by || (at most {max_actions}). Keep the whole response "
    "under {max_tokens} tokens."
)
# a concrete reply in the env's own syntax: small models otherwise copy the placeholders verbatim
EXAMPLE_REPLY = "Example reply: <think>I choose {action}.</think><answer>{action}</answer>"
# the observation of an episode whose env.reset timed out (its one unsampled turn's prompt)
NO_OBSERVATION = "(The environment did not respond.)"
# seconds an env call may take (conf/env/*.yaml: env.step_timeout_s)
DEFAULT_STEP_TIMEOUT_S = 60.0

T = TypeVar("T")


@dataclass(frozen=True)
class AgentConfig:
    max_turns: int = 5
    max_actions_per_turn: int = 2
    format_penalty: float = -0.1
    max_context: int = 4096  # tokens of prompt + response the model may hold
    step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S  # per env call; None or 0 = no limit
    layout: str = "auto"  # one sequence per episode or per turn (rollout.layout, ``ragen2.agent.render``)
    # the function-call format of tool turns (env.tool_format, ``ragen2.agent.call_formats``)
    tool_format: str = AUTO

    def __post_init__(self) -> None:
        for key in ("max_turns", "max_actions_per_turn"):
            if getattr(self, key) < 1:
                raise ValueError(f"env.{key}={getattr(self, key)} must be ≥ 1. Fix: env.{key}=1 or more")
        check_format_name(self.tool_format)
        limit = self.step_timeout_s
        if limit is not None and (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not math.isfinite(limit)
            or limit < 0
        ):
            raise ValueError(
                f"env.step_timeout_s={limit!r} must be a number of seconds ≥ 0 (0 or null: no limit). "
                f"Fix: env.step_timeout_s={DEFAULT_STEP_TIMEOUT_S:g}"
            )


def system_prompt(instructions: str, cfg: AgentConfig, max_tokens: int, rule: str = FORMAT_RULE) -> str:
    rule = rule.format(max_actions=cfg.max_actions_per_turn, max_tokens=max_tokens)
    return f"{instructions.strip()}\n\n{rule}"


def user_message(
    turn: int,
    observation: str,
    actions_left: int,
    cfg: AgentConfig,
    max_tokens: int,
    example: str | None = None,
    rule: str = FORMAT_RULE,
) -> str:
    rule = rule.format(max_actions=cfg.max_actions_per_turn, max_tokens=max_tokens)
    text = f"Turn {turn}:\nState:\n{observation}\nYou have {actions_left} actions left.\n{rule}"
    return text if example is None else f"{text}\n{EXAMPLE_REPLY.format(action=example)}"


class EpisodeRunner:
    """Runs groups × group_size episodes of one env against a Sampler."""

    def __init__(
        self,
        env_factory: Callable[[], Any],
        tokenizer: Any,
        cfg: AgentConfig,
        params: SamplingParams,
        env_id: str = "",
        tools: Toolbox | None = None,
    ) -> None:
        self.env_factory = env_factory
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.params = params
        self.env_id = env_id
        self.tools = tools
        self._schemas = tools.schemas if tools else None
        self._rule = TOOL_RULE if tools else FORMAT_RULE
        # before the first rollout: a history-rewriting template gets one sequence per turn, or is refused
        check_tool_template(tokenizer, self._schemas)
        self._calls = call_format(tokenizer, cfg.tool_format) if tools else None
        self.layout = check_chat_template(tokenizer, cfg.layout, self._schemas)
        check_vocabulary(tokenizer, env_id)
        special = {tokenizer.eos_token, tokenizer.pad_token}
        self._strip = tuple(s for s in special if s)
        # the env's reasoning grammar (TextEnv.reasoning_grammar), read off the first env made
        self._grammar: frozenset[str] | None = None
        self._grammar_read = False
        self._renderer: TurnRenderer | None = None
        self._pool: list[Any] = []  # one env per episode slot, reused across collections (``_env``)
        self._first: tuple[str, str, list[int]] | None = None  # the last first prompt rendered

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def collect(
        self,
        sampler: Sampler,
        seeds: Sequence[int],
        group_size: int,
        sample_seed: int,
        params: SamplingParams | None = None,
        desc: str = "rollout",
        group_done: Callable[[list[Episode]], None] | None = None,
    ) -> list[Episode]:
        """Roll out ``group_size`` episodes for each instance seed; ``sample_seed`` seeds the sampler.

        ``params`` replaces the runner's sampling parameters for this collection (e.g. greedy
        evaluation); the prompts state the runner's own token limit either way. ``desc`` names the
        progress bar (interactive terminals only). ``group_done`` gets each seed's episodes as soon as
        all of them have ended (a caller can write them out before the slowest group finishes).
        """
        params = params or self.params
        envs: list[tuple[Any, TurnRenderer]] = []
        episodes: list[Episode] = []
        prompts: list[list[int]] = []
        observations: list[str] = []
        chats: list[list[Message]] = []  # each episode's conversation, for a renderer that rewrites it
        offsets: list[int] = []  # where each episode's next turn starts in its training row (``Turn.offset``)
        for g, seed in enumerate(seeds):
            for k in range(group_size):
                env = self._env(len(episodes))
                if not self._grammar_read:
                    grammar = env.reasoning_grammar()
                    self._grammar, self._grammar_read = None if grammar is None else frozenset(grammar), True
                ep = Episode(env_id=self.env_id, seed=int(seed), group=g, sample=k, system_prompt="")
                try:
                    obs, info = self._call(ep, "reset", env.reset, seed=int(seed), options={"sample": k})
                    ep.kind = str(info.get("kind", ""))
                except EnvTimeout:
                    obs = None
                shown = NO_OBSERVATION if obs is None else obs
                renderer, first, user = self.first_prompt(env, shown)
                ep.system_prompt = renderer.system_prompt
                if len(first) + self.params.max_new_tokens > self.cfg.max_context:
                    raise ValueError(
                        f"the first prompt of {self.env_id or 'the env'} is {len(first)} tokens, so "
                        f"rollout.max_new_tokens={self.params.max_new_tokens} does not fit "
                        f"rollout.max_context={self.cfg.max_context}. Fix: raise rollout.max_context or lower "
                        "rollout.max_new_tokens."
                    )
                if obs is None:
                    _end_unsampled(ep, first, shown)
                envs.append((env, renderer))
                episodes.append(ep)
                prompts.append(first)
                observations.append(shown)
                chats.append(
                    [{"role": "system", "content": renderer.system_prompt}, {"role": "user", "content": user}]
                )
                offsets.append(0)
        actions_used = [0] * len(episodes)
        # an episode whose env timed out leaves for good: its env is never reset, stepped or rendered again
        # (a timed-out reset's prompt reads only what the env's configuration fixes: instructions, example)
        active = [i for i, ep in enumerate(episodes) if not ep.end_reason]
        report = _GroupReport(episodes, group_size, group_done)
        report(active)
        with bar(self.cfg.max_turns, desc, "turn") as progress:
            for turn in range(1, self.cfg.max_turns + 1):
                meta = None
                if sampler.needs_oracle:
                    plans = {
                        i: self._planned(episodes[i], envs[i][0], prompts[i], observations[i]) for i in active
                    }
                    active = [i for i in active if not episodes[i].end_reason]
                    meta = [plans[i] for i in active]
                if not active:
                    break
                samples = sampler.generate(
                    [prompts[i] for i in active], params, sample_seed * 1009 + turn, meta
                )
                still_active = []
                for i, sample in zip(active, samples, strict=True):
                    env, renderer = envs[i]
                    ep = episodes[i]
                    t, timed_out = self._apply(ep, env, prompts[i], observations[i], sample, offsets[i])
                    ep.turns.append(t)
                    actions_used[i] += len(t.actions)
                    ep.success = ep.success or any(bool(info.get("success")) for info in t.infos)
                    if timed_out:
                        ep.truncated, ep.end_reason = True, ENV_TIMEOUT
                        continue
                    done = any(info.get("_terminated") or info.get("_truncated") for info in t.infos)
                    if done:
                        ep.terminated = any(info.get("_terminated") for info in t.infos)
                        ep.truncated = not ep.terminated
                        ep.end_reason = "terminated" if ep.terminated else "env_truncated"
                        continue
                    if turn == self.cfg.max_turns:
                        ep.truncated, ep.end_reason = True, "max_turns"
                        continue
                    if t.tool_calls:  # the results are the next prompt's new text
                        obs = "\n".join(c.content for c in t.tool_calls)
                        shown = [{"role": "tool", "content": c.content} for c in t.tool_calls]
                    else:
                        obs = env.render_state()
                        left = max(0, self.cfg.max_turns * self.cfg.max_actions_per_turn - actions_used[i])
                        shown = [{"role": "user", "content": self._user(env, turn + 1, obs, left)}]
                    chats[i] += [assistant_message(self.tokenizer, sample.ids), *shown]
                    nxt = renderer.next_prompt(prompts[i], sample.ids, chats[i])
                    if len(nxt) + self.params.max_new_tokens > self.cfg.max_context:
                        ep.truncated, ep.end_reason = True, "context"
                        continue
                    if renderer.rewrites:  # the next turn's sequence follows this one's in the row
                        offsets[i] = t.end
                    prompts[i], observations[i] = nxt, obs
                    still_active.append(i)
                active = still_active
                report(active)
                progress.update()
                progress.set_postfix_str(f"{len(episodes) - len(active)}/{len(episodes)} episodes done")
                if not active:
                    break
        report(())  # every episode has ended: the groups the oracle's plans ended before a turn too
        for slot, ep in enumerate(episodes):
            if ep.end_reason == ENV_TIMEOUT:  # a call that timed out may still run: its env is not reused
                self._pool[slot] = None
        return episodes

    def _env(self, slot: int) -> Any:
        """The env of the collection's ``slot``-th episode: made once, then reset by every collection (an env
        is reusable by gymnasium's contract; making one per episode cost more than sampling a small model)."""
        self._pool.extend([None] * (slot + 1 - len(self._pool)))
        env = self._pool[slot]
        if env is None:
            env = self._pool[slot] = self.env_factory()
        return env

    def first_prompt(self, env: Any, observation: str) -> tuple[TurnRenderer, list[int], str]:
        """The renderer of ``env``'s system prompt, the ids of turn 1 showing ``observation`` and its user
        message. The last renderer is kept: a run whose system prompt does not change renders its template
        once."""
        sys_prompt = system_prompt(env.instructions, self.cfg, self.params.max_new_tokens, self._rule)
        if self._renderer is None or self._renderer.system_prompt != sys_prompt:
            self._renderer = renderer_for(self.tokenizer, sys_prompt, self.layout, self._schemas)
        actions = self.cfg.max_turns * self.cfg.max_actions_per_turn
        user = self._user(env, 1, observation, actions)
        # the K rollouts of a group come one after another with the same text: encode it once
        if self._first is None or self._first[:2] != (sys_prompt, user):
            self._first = (sys_prompt, user, self._renderer.first_prompt(user))
        return self._renderer, list(self._first[2]), user

    def first_prompts(self, seeds: Sequence[int]) -> list[tuple[list[int], dict[str, Any]]]:
        """Each instance seed's turn-1 prompt ids, as ``collect`` renders them, and its reset ``info``."""
        out = []
        for seed in seeds:
            env = self.env_factory()
            obs, info = env.reset(seed=int(seed), options={"sample": 0})
            out.append((self.first_prompt(env, obs)[1], info))
        return out

    def grammar_ids(self) -> list[list[int]] | None:
        """The ids of every sentence of the env's reasoning grammar followed by ``</think>`` (what the exact
        figures score, ``ragen2.diagnostics.exact``), or None when the env's reasoning is free text."""
        grammar = self.env_factory().reasoning_grammar()
        if grammar is None:
            return None
        return [list(self.tokenizer.encode(z + THINK_CLOSE, add_special_tokens=False)) for z in grammar]

    def _call(self, ep: Episode, call: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` under ``step_timeout_s``; a call past it is logged, then EnvTimeout."""
        try:
            return call_with_timeout(fn, self.cfg.step_timeout_s, *args, **kwargs)
        except EnvTimeout:
            log.warning(
                "%s seed %d (sample %d): env.%s did not return within env.step_timeout_s=%g s; the "
                "episode ends as a failure (rollout/env_timeouts) and its env is discarded. Fix: raise "
                "env.step_timeout_s if the env is only slow (null: no limit)",
                ep.env_id or "the env",
                ep.seed,
                ep.sample,
                call,
                self.cfg.step_timeout_s,
            )
            raise

    def _planned(self, ep: Episode, env: Any, prompt: list[int], observation: str) -> PromptMeta:
        """The solver's plan for this turn and its reasoning (None where it has none); a timeout ends the
        episode before the turn is sampled."""
        try:
            plan = self._oracle_plan(ep, env)
            reasoning = self._call(ep, "oracle_reasoning()", env.oracle_reasoning, plan) if plan else None
        except EnvTimeout:
            if ep.turns:
                ep.truncated, ep.end_reason = True, ENV_TIMEOUT
            else:
                _end_unsampled(ep, prompt, observation)
            return PromptMeta()
        return PromptMeta(oracle=ACTION_SEP.join(plan) if plan else None, reasoning=reasoning)

    def _oracle_plan(self, ep: Episode, env: Any) -> list[str]:
        """The env solver's moves for one turn (up to max_actions_per_turn), played on a copy of the env."""
        first = self._call(ep, "oracle_action()", env.oracle_action)
        if first is None or self.cfg.max_actions_per_turn == 1:
            return [] if first is None else [first]
        sim, plan = copy.deepcopy(env), [first]
        _, _, terminated, truncated, _ = self._call(ep, f"step({first!r}) on a copy", sim.step, first)
        while len(plan) < self.cfg.max_actions_per_turn and not (terminated or truncated):
            action = self._call(ep, "oracle_action() on a copy", sim.oracle_action)
            if action is None:
                break
            plan.append(action)
            _, _, terminated, truncated, _ = self._call(ep, f"step({action!r}) on a copy", sim.step, action)
        return plan

    def _user(self, env: Any, turn: int, obs: str, actions_left: int) -> str:
        return user_message(
            turn, obs, actions_left, self.cfg, self.params.max_new_tokens, env.example_action(), self._rule
        )

    def _apply(
        self, ep: Episode, env: Any, prompt: list[int], observation: str, sample: Any, offset: int = 0
    ) -> tuple[Turn, bool]:
        """The turn, and whether an ``env.step`` timed out (its action is not counted: it never completed)."""
        text = self._decode(sample.ids)
        calls = tool_turn(text, self._strip, self._calls) if self._calls else None
        if calls is not None:
            return self._tool_turn(env, prompt, observation, sample, offset, text, calls[1]), False
        parsed = parse_turn(text, self.cfg.max_actions_per_turn, self._strip, self._grammar)
        reward, valid, infos = 0.0, [], []
        timed_out = False
        for action in parsed.actions:
            try:
                _, r, terminated, truncated, info = self._call(ep, f"step({action!r})", env.step, action)
            except EnvTimeout:
                timed_out = True
                break
            reward += r
            valid.append(bool(info.get("action_is_valid", True)))
            infos.append({**info, "_terminated": terminated, "_truncated": truncated})
            if terminated or truncated:
                break
        bad = not parsed.format_ok or not all(valid)
        turn = self._turn(
            prompt,
            observation,
            sample,
            offset,
            text,
            format_ok=parsed.format_ok,
            actions=parsed.actions[: len(valid)],
            actions_valid=valid,
            reward=reward,
            penalty=self.cfg.format_penalty if bad else 0.0,
            infos=infos,
        )
        return turn, timed_out

    def _turn(
        self, prompt: list[int], observation: str, sample: Any, offset: int, text: str, **outcome: Any
    ) -> Turn:
        """A sampled turn: its ids and text as sampled, its Z, and ``outcome`` (what the env or the tools made
        of it: the format, actions, reward, penalty …)."""
        return Turn(
            prompt_ids=prompt,
            sampled_ids=list(sample.ids),
            sampler_logprobs=sample.logprobs,
            entropies=sample.entropies,
            text=text,
            finish_reason=sample.finish_reason,
            observation=observation,
            reasoning_ids=reasoning_ids(sample.ids, self._decode),
            offset=offset,
            **outcome,
        )

    def _tool_turn(
        self,
        env: Any,
        prompt: list[int],
        observation: str,
        sample: Any,
        offset: int,
        text: str,
        bodies: list[str],
    ) -> Turn:
        """A tool turn: each call run against ``env``'s tools (an error is a message to the policy, and a
        penalty where the policy caused it, ``ToolCall.penalized``). A tool that moved the env (``EnvStep``)
        gives the turn its reward, info and penalty, as a text action does; the call that ends the episode is
        the last."""
        assert self.tools is not None
        tools = self.tools.bind(env)
        calls: list[ToolCall] = []
        for body in bodies[: self.cfg.max_actions_per_turn]:
            calls.append(call := run_call(body, tools, self.cfg.step_timeout_s))
            if call.step is not None and call.step.ended:
                break
        steps = [c.step for c in calls if c.step is not None]
        # an invalid move costs as an action
        valid = [bool(s.info.get("action_is_valid", True)) for s in steps]
        return self._turn(
            prompt,
            observation,
            sample,
            offset,
            text,
            format_ok=True,
            actions=[],
            actions_valid=[],
            reward=sum(step.reward for step in steps),
            penalty=self.cfg.format_penalty if any(c.penalized for c in calls) or not all(valid) else 0.0,
            infos=[{**s.info, "_terminated": s.terminated, "_truncated": s.truncated} for s in steps],
            tool_calls=calls,
        )


class _GroupReport:
    """Hands each group's episodes to ``done`` once, when none of them is still active."""

    def __init__(
        self, episodes: list[Episode], group_size: int, done: Callable[[list[Episode]], None] | None
    ) -> None:
        self.episodes, self.group_size, self.done = episodes, group_size, done
        self.waiting = list(range(len(episodes) // group_size))

    def __call__(self, active: Sequence[int]) -> None:
        if self.done is None:
            return
        busy = {i // self.group_size for i in active}
        for g in [g for g in self.waiting if g not in busy]:
            self.done(self.episodes[g * self.group_size : (g + 1) * self.group_size])
            self.waiting.remove(g)


def _end_unsampled(ep: Episode, prompt: list[int], observation: str) -> None:
    """End an episode whose env timed out before its first turn was sampled: one turn with the prompt it
    would have been given and nothing sampled (no loss, return 0), so its group keeps every row."""
    ep.turns.append(
        Turn(
            prompt_ids=list(prompt),
            sampled_ids=[],
            sampler_logprobs=[],
            text="",
            finish_reason=ENV_TIMEOUT,
            observation=observation,
            format_ok=True,  # the policy was never asked: not a format failure of its own
            actions=[],
            actions_valid=[],
            reward=0.0,
            penalty=0.0,
            reasoning_ids=None,
            entropies=[],
        )
    )
    ep.truncated, ep.end_reason = True, ENV_TIMEOUT
