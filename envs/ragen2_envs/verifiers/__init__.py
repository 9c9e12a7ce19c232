"""verifiers' environments (verifiers 0.4.0) as ragen2 environments (installed as scripts/install.sh does).

Importing this registers ``ragen2/Verifiers-v0`` with gymnasium, as a package outside ragen2 registers its
env: conf/env/verifiers.yaml names it ``ragen2_envs.verifiers:ragen2/Verifiers-v0`` (ragen2_envs.registry), so
ragen2 runs without verifiers installed, and verifiers loads only when this env is asked for.
"""

import gymnasium

if "ragen2/Verifiers-v0" not in gymnasium.registry:
    # as ragen2's own ids: no TimeLimit wrapper (the agent owns max_turns), no checker on every make
    gymnasium.register(
        id="ragen2/Verifiers-v0",
        entry_point="ragen2_envs.verifiers.env:VerifiersEnv",
        disable_env_checker=True,
    )
