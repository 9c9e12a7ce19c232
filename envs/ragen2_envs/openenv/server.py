"""Any ragen2 environment as an OpenEnv server (openenv-core's ``create_fastapi_app``), for OpenEnv's clients:
ragen2's own (``env=openenv``) and any other trainer's::

    python -m ragen2_envs.openenv.server ragen2/FrozenLake-v0 --port 8000 --kwargs '{"success_rate": 1.0}'

Each connection gets an env of its own. The action is ``{"message": <one action's text>}``. The observation holds
the env's rendered state (``text``) and, as fields (openenv-core 0.3.0 sends no ``metadata``), ``success``,
``action_is_valid`` and ``truncated``. ``reset`` takes ``seed`` and ``sample`` (the rollout's index in its group,
whose per-step noise it seeds: ragen2's group contract); the session's ``state`` carries the env's solver's next
action (``oracle``), and the server's ``/metadata`` description is the env's instructions.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Sequence
from typing import Any

import ragen2_envs
from ragen2_envs.adapters import require
from ragen2_envs.openenv.env import ENV_ID, INSTALL

api: Any = require("openenv.core.env_server", ENV_ID, INSTALL)
server_types: Any = require("openenv.core.env_server.types", ENV_ID, INSTALL)


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


class ServedEnv(api.Environment):
    """One session's ragen2 env, as an OpenEnv ``Environment``."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session makes its own env: nothing is shared

    def __init__(self, env_id: str, env_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.env_id = env_id
        self.env = ragen2_envs.make(env_id, **env_kwargs)
        self.episode_id: str | None = None
        self.steps = 0
        self.started = False  # a ragen2 env has no state to ask its solver about before its first reset

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, sample: int = 0, **kwargs: Any
    ) -> TextObservation:
        text, info = self.env.reset(seed=seed, options={"sample": int(sample)})
        self.episode_id, self.steps, self.started = episode_id, 0, True
        return TextObservation(text=text, metadata=_jsonable(info))

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        text, reward, terminated, truncated, info = self.env.step(action.message)
        self.steps += 1
        return TextObservation(
            text=text,
            reward=reward,
            done=terminated or truncated,
            truncated=truncated,
            success=bool(info.get("success")),
            action_is_valid=bool(info.get("action_is_valid", True)),
            metadata=_jsonable(info),
        )

    @property
    def state(self) -> TextState:
        oracle = self.env.oracle_action() if self.started else None
        return TextState(episode_id=self.episode_id, step_count=self.steps, oracle=oracle)

    def get_metadata(self) -> Any:
        return server_types.EnvironmentMetadata(name=self.env_id, description=self.env.instructions)

    def close(self) -> None:
        self.env.close()


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` as JSON would carry it (numpy numbers and the like as text)."""
    return json.loads(json.dumps(info, default=str))


def app(env_id: str, env_kwargs: dict[str, Any] | None = None, max_sessions: int = 64) -> Any:
    """The FastAPI app serving ``env_id`` (made with ``env_kwargs``) to up to ``max_sessions`` connections."""
    kwargs = dict(env_kwargs or {})
    ragen2_envs.make(env_id, **kwargs)  # a bad id or option fails here, not at the first connection
    return api.create_fastapi_app(
        functools.partial(ServedEnv, env_id, kwargs),
        TextAction,
        TextObservation,
        max_concurrent_envs=max_sessions,
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
    args = parser.parse_args(argv)
    import uvicorn

    served = app(args.env_id, json.loads(args.kwargs), args.max_sessions)
    uvicorn.run(served, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
