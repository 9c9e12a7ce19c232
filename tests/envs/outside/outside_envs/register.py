"""Registers the guessing game with gymnasium when imported (``env.id=outside_envs.register:<id>``)."""

import gymnasium

gymnasium.register(id="outside/GuessGym-v0", entry_point="outside_envs.guess:GuessEnv")
