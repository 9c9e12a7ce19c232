"""GEM's environments (gem-llm) as ragen2 environments (the optional extra ``gem``).

Importing this registers ``ragen2/GEM-v0`` with gymnasium, as a package outside ragen2 registers its env:
conf/env/gem.yaml names it ``ragen2_envs.gem:ragen2/GEM-v0`` (ragen2_envs.registry), so ragen2 runs without
gem-llm installed, and GEM loads only when this env is asked for.
"""

import gymnasium

if "ragen2/GEM-v0" not in gymnasium.registry:
    # as ragen2's own ids: no TimeLimit wrapper (the agent owns max_turns), no checker on every make
    gymnasium.register(id="ragen2/GEM-v0", entry_point="ragen2_envs.gem.env:GemEnv", disable_env_checker=True)
