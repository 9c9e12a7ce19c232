"""SearchQA: answer a question by searching a corpus (``search[query]``) and answering (``finish[answer]``).

Follows the reference's SearchEnv (RAGEN, adapted from rLLM): ``search`` shows the top-k passages
under a character budget, ``finish`` ends the episode with reward 1 on a normalised exact match,
else the token F1 when it reaches ``f1_threshold`` (0.3), else 0. Departures: the question is drawn
from ``np_random`` (the reference indexes ``seed % len``); text that is neither action is invalid
and changes nothing (the reference guesses an answer from free text and ends the episode);
``success`` means an exact match (the reference also counts an F1 above the threshold).

Under ``env.tools: [search]`` (docs/tools.md) the retriever is also a tool: ``search(query)`` returns the
passages and counts against ``max_searches`` like the action, and the final answer stays the action
``finish[<answer>]`` inside ``<answer>``, which ends the episode. Under ``env.tools: [search, finish]`` the
answer is a tool call too, ``finish(answer)``: a tool that moves the env (its ``EnvStep``), scored and ended as
the action is, so an episode runs on function calls alone.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from ragen2_envs.base import EnvStep, TextEnv
from ragen2_envs.options import OneOf, Range
from ragen2_envs.searchqa.data import QAExample, load_corpus_jsonl, load_qa_jsonl
from ragen2_envs.searchqa.kb import build_knowledge_base
from ragen2_envs.searchqa.retrieval import (
    BM25Retriever,
    DenseRetriever,
    Passage,
    Retriever,
    format_passages,
)
from ragen2_envs.searchqa.scoring import score_answer
from ragen2_envs.searchqa.text import to_charset

_ACTION = re.compile(r"(search|finish)\[(.*)\]", re.IGNORECASE | re.DOTALL)
#: longer queries are cut: BM25 cost grows with query length and nothing useful lies past this
MAX_QUERY_CHARS = 1000
RETRIEVERS = ("bm25", "dense")
SPLITS = ("train", "test")


class SearchQAEnv(TextEnv):
    """Question answering with a search tool over a built-in knowledge base or a JSONL corpus."""

    default_max_turns: ClassVar[int] = 5  # reference config _10_search.yaml: max_turn 5
    default_max_actions_per_turn: ClassVar[int] = 1
    #: methods the agent may call as tools (env.tools)
    tool_names: ClassVar[tuple[str, ...]] = ("search", "finish")

    def __init__(
        self,
        data_path: str | None = None,
        corpus_path: str | None = None,
        split: Annotated[str, OneOf(SPLITS)] = "train",
        kb_seed: Annotated[int, Range(0)] = 0,
        retriever: Annotated[str, OneOf(RETRIEVERS)] = "bm25",
        top_k: Annotated[int, Range(1)] = 3,
        max_obs_chars: Annotated[int, Range(50)] = 1500,  # enough to show a passage
        max_searches: Annotated[int, Range(1)] = 10,
        f1_threshold: Annotated[float, Range(0.0, 1.0)] = 0.3,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(render_mode=render_mode)
        if (data_path is None) != (corpus_path is None):
            raise ValueError(
                f"data_path={data_path!r}, corpus_path={corpus_path!r}: give both (questions JSONL and "
                "corpus JSONL) or neither (the built-in knowledge base)"
            )
        self.top_k = top_k
        self.max_obs_chars = max_obs_chars
        self.max_searches = max_searches
        self.f1_threshold = f1_threshold

        passages: tuple[Passage, ...]
        if data_path is not None and corpus_path is not None:
            self.examples: tuple[QAExample, ...] = load_qa_jsonl(data_path)
            passages = load_corpus_jsonl(corpus_path)
            cache_key: tuple[Any, ...] = ("jsonl", corpus_path)
        else:
            kb = build_knowledge_base(kb_seed)
            self.examples = kb.train if split == "train" else kb.test
            passages = kb.passages
            cache_key = ("kb", kb_seed)
        self.retriever: Retriever = (
            BM25Retriever(passages, cache_key) if retriever == "bm25" else DenseRetriever(passages, cache_key)
        )
        self.example = self.examples[0]
        self._feedback = ""
        self._searches = 0
        self._done = False

    @property
    def instructions(self) -> str:
        return (
            "You answer a question by searching a knowledge base. The names in the questions are not "
            "common knowledge: search for them before you answer.\n"
            "Actions (one per turn):\n"
            "  search[<query>]  show the top passages for the query (search for an entity's name)\n"
            "  finish[<answer>]  give your final answer (a short phrase, e.g. a name, place or year) "
            "and end the episode\n"
            "Reward: 1 for an exact answer, partial credit for a partly overlapping one, else 0.\n"
            "Example: <answer>search[Orvane Tesk]</answer> then <answer>finish[Velmora]</answer>"
        )

    def render_state(self) -> str:
        lines = [f"Question: {self.example.question}"]
        if self._feedback:
            lines.append(self._feedback)
        if not self._done:
            lines.append(f"Searches left: {self.max_searches - self._searches}")
            lines.append("Available actions: search[<query>], finish[<answer>]")
        return to_charset("\n".join(lines))

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.example = self.examples[int(self.np_random.integers(len(self.examples)))]
        self._feedback = ""
        self._searches = 0
        self._done = False
        return {"hops": self.example.hops}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        match = _ACTION.fullmatch(action)
        argument = match.group(2).strip() if match else ""
        if self._done or match is None or not argument:
            return 0.0, self._done, False, {"action_is_valid": False}
        if match.group(1).lower() == "finish":
            score = score_answer(argument, self.example.answers, self.f1_threshold)
            self._done = True
            self._feedback = f"Your answer: {argument}"
            info = {"action_is_valid": True, "success": score.em == 1.0, "em": score.em, "f1": score.f1}
            return score.reward, True, False, info
        found = self._search(argument)
        # out of searches without an answer: the env's own budget ran out, a truncation
        truncated = self._searches >= self.max_searches
        self._done = truncated
        return 0.0, False, truncated, {"action_is_valid": True, "num_results": found}

    def _search(self, query: str) -> int:
        """Run one search (shown by ``render_state``); the number of passages found."""
        query = query[:MAX_QUERY_CHARS]
        results = self.retriever.search(query, self.top_k)
        self._searches += 1
        self._feedback = f'Search results for "{query}":\n' + format_passages(results, self.max_obs_chars)
        return len(results)

    def search(self, query: str) -> str:
        """Search the knowledge base and return the top passages.

        Args:
            query: What to search for, e.g. an entity's name.
        """
        if self._done or self._searches >= self.max_searches:
            return "No searches left: give your answer as <answer>finish[<answer>]</answer>."
        if not query.strip():
            return "The query is empty: search for a name."
        self._search(query.strip())
        return to_charset(self._feedback)

    def finish(self, answer: str) -> EnvStep:
        """Give your final answer and end the episode.

        Args:
            answer: A short phrase, e.g. a name, place or year.
        """
        observation, reward, terminated, truncated, info = self.step(f"finish[{answer}]")
        return EnvStep(observation, reward, terminated, truncated, info)

    def example_action(self) -> str:
        return "search[who founded the company]"

    def oracle_action(self) -> str | None:
        """Search each entity on the question's hop chain in turn, then finish with the gold answer."""
        if self._done:
            return None
        if self._searches < len(self.example.oracle_queries):
            return f"search[{self.example.oracle_queries[self._searches]}]"
        return f"finish[{self.example.answers[0]}]"
