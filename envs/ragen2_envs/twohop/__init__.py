"""TwoHop: the model organism of template collapse (a two-lookup task with an enumerable reasoning grammar)."""

from ragen2_envs.twohop.env import TwoHopEnv

__all__ = ["TwoHopEnv"]
