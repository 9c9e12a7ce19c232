"""The multi-turn agent protocol: prompt rendering, response parsing, the episode runner."""

from ragen2.agent.episode import Episode, Turn
from ragen2.agent.parsing import ParsedTurn, parse_turn
from ragen2.agent.reasoning import reasoning_ids
from ragen2.agent.render import ChatRenderer, check_chat_template, template_fragments
from ragen2.agent.runner import AgentConfig, EpisodeRunner

__all__ = [
    "AgentConfig",
    "ChatRenderer",
    "Episode",
    "EpisodeRunner",
    "ParsedTurn",
    "Turn",
    "check_chat_template",
    "parse_turn",
    "reasoning_ids",
    "template_fragments",
]
