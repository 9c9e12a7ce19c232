"""reasoning-gym's procedural tasks as single-turn environments (the optional extra ``reasoning-gym``).

Importing this registers ``ragen2/ReasoningGym-v0`` with gymnasium, as a package outside ragen2 registers its env:
conf/env/reasoning_gym.yaml names it ``ragen2_envs.reasoning_gym:ragen2/ReasoningGym-v0`` (ragen2_envs.registry),
so ragen2 runs without reasoning-gym installed, and reasoning-gym loads only when this env is asked for.
"""

import gymnasium

if "ragen2/ReasoningGym-v0" not in gymnasium.registry:
    # as ragen2's own ids: no TimeLimit wrapper (the agent owns max_turns), no checker on every make
    gymnasium.register(
        id="ragen2/ReasoningGym-v0",
        entry_point="ragen2_envs.reasoning_gym.env:ReasoningGymEnv",
        disable_env_checker=True,
    )
