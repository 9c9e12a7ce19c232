"""OpenEnv's environments (openenv-core) as ragen2 environments (installed as scripts/install.sh does).

Importing this registers ``ragen2/OpenEnv-v0`` with gymnasium, as a package outside ragen2 registers its env:
conf/env/openenv.yaml names it ``ragen2_envs.openenv:ragen2/OpenEnv-v0`` (ragen2_envs.registry), so ragen2 runs
without openenv-core installed, and OpenEnv loads only when this env is asked for. ``ragen2_envs.openenv.server``
serves any ragen2 environment as an OpenEnv server.
"""

import gymnasium

if "ragen2/OpenEnv-v0" not in gymnasium.registry:
    # as ragen2's own ids: no TimeLimit wrapper (the agent owns max_turns), no checker on every make
    gymnasium.register(
        id="ragen2/OpenEnv-v0", entry_point="ragen2_envs.openenv.env:OpenEnvEnv", disable_env_checker=True
    )
