"""TwoHop: a model organism of template collapse (single turn), where reasoning must carry the input.

The observation holds two tables and a query. With ``hops=2`` (the organism proper): a ``keys`` table of
``key=middle`` rows, a ``links`` table of ``middle=value`` rows (in another order) and a query key; the answer is
the value of the query's middle. The reasoning is held to a finite grammar (``reasoning_grammar``): ``<style> <middle>
<value>``, with ``num_styles`` style words, ``num_middles`` middles and ``num_values`` values, so that every
reasoning can be enumerated and I(X;Z) computed exactly. The middle and the value are where the reasoning
reads the input, one lookup each. The organism's tokenizer reads a row as one token, so a lookup is one
attention step: the 2-layer organism model brings the query key into place and finds its row (two steps), then
finds the middle's row from the middle it just wrote, and copies the value it wrote into its answer; without
the reasoning it would need three steps in a row (docs/organism.md shows its answer follows the reasoning). The style
word carries entropy that owes nothing to the input, so H(Z|X) can stay high while I(X;Z) falls: template
collapse, on purpose.

Each instance is one of three kinds (``info["kind"]``), drawn from ``np_random``:

* ``learnable``: as above; the reward has variance while the policy sometimes answers right;
* ``easy`` (zero variance once learnt): the query's value is shown beside it (``query: C = v4``);
* ``impossible`` (zero variance): the query is missing (``query: ?``); every answer earns 0 and the solver
  has no move (``info["solvable"]`` is False).

``zero_variance_share`` (p₀) is the share of easy and impossible instances, ``easy_share`` the easy ones' part
of it. ``reward_noise`` flips a reward (1 ↔ 0) with that probability, drawn from ``dynamics_rng``. ``hops=1``
is the negative control: the second table maps keys straight to values, so the answer needs no reasoning (the
solver's reasoning still names the query's middle and the answer).

Reward 1 for the right value (``success``), else 0; a word that is no value is an invalid action (0, the turn's
format penalty is the agent's). One valid answer ends the episode.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

from ragen2_envs.base import TextEnv
from ragen2_envs.options import OneOf, Range

#: words of the style slots (the reasoning's input-free part)
STYLES = ("so", "well", "then", "now", "ok", "hmm", "right", "thus")
KEYS = tuple("ABCDEFGHIJKLMNOP")
MAX_MIDDLES = 32
MAX_VALUES = 32
#: the largest reasoning grammar (num_styles × num_middles × num_values): the exact MI scores every sentence
#: under every held-out prompt at each MI pass
MAX_GRAMMAR = 1024
KINDS = ("learnable", "easy", "impossible")


@functools.cache
def grammar(num_styles: int, num_middles: int, num_values: int) -> tuple[str, ...]:
    """Every reasoning TwoHop accepts: ``<style> <middle> <value>``, in the order of styles, then middles."""
    product = itertools.product(STYLES[:num_styles], range(num_middles), range(num_values))
    return tuple(f"{style} {middle(m)} {value(v)}" for style, m, v in product)


def middle(i: int) -> str:
    return f"m{i}"


def value(i: int) -> str:
    return f"v{i}"


class TwoHopEnv(TextEnv):
    """Answer the value two lookups away from the query key; reason in ``<style> <middle> <value>``."""

    default_max_turns: ClassVar[int] = 1
    default_max_actions_per_turn: ClassVar[int] = 1

    def __init__(
        self,
        num_pairs: Annotated[int, Range(2, len(KEYS))] = 4,
        num_keys: Annotated[int, Range(2, len(KEYS))] = 16,
        num_middles: Annotated[int, Range(2, MAX_MIDDLES)] = 16,
        num_values: Annotated[int, Range(2, MAX_VALUES)] = 16,
        num_styles: Annotated[int, Range(1, len(STYLES))] = 2,
        zero_variance_share: Annotated[float, Range(0.0, 1.0, high_open=True)] = 0.75,
        easy_share: Annotated[float, Range(0.0, 1.0)] = 0.5,
        reward_noise: Annotated[float, Range(0.0, 0.5)] = 0.0,
        hops: Annotated[int, OneOf((1, 2))] = 2,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(render_mode=render_mode)
        if num_pairs > min(num_keys, num_middles, num_values):
            raise ValueError(
                f"num_pairs={num_pairs} needs as many distinct keys (num_keys={num_keys}), middles "
                f"(num_middles={num_middles}) and values (num_values={num_values}): each table row has its own. "
                f"Fix: num_pairs ≤ {min(num_keys, num_middles, num_values)}"
            )
        sentences = num_styles * num_middles * num_values
        if sentences > MAX_GRAMMAR:
            raise ValueError(
                f"num_styles={num_styles}, num_middles={num_middles} and num_values={num_values} make {sentences} "
                f"reasonings (their product), over the {MAX_GRAMMAR} the exact MI enumerates. Fix: fewer "
                "num_styles, num_middles or num_values"
            )
        self.num_pairs = num_pairs
        self.num_keys = num_keys
        self.num_middles = num_middles
        self.num_values = num_values
        self.num_styles = num_styles
        self.zero_variance_share = float(zero_variance_share)
        self.easy_share = float(easy_share)
        self.reward_noise = float(reward_noise)
        self.hops = hops
        self._grammar = grammar(num_styles, num_middles, num_values)
        self.kind = "learnable"
        self.keys: list[str] = []
        self.middles: list[str] = []  # the middle of each key, in the keys table's order
        self.second: list[tuple[str, str]] = []  # the second table's rows, as shown
        self.query = ""
        self.answer = ""
        self.result = ""
        self.done = False

    @property
    def instructions(self) -> str:
        second = "links maps each middle to a value" if self.hops == 2 else "values maps each key to a value"
        return (
            f"Find the value of the query. keys maps each key to a middle; {second}. "
            "Reason in three words: a style word, the middle of the query, its value. "
            "Then answer the value."
        )

    def reasoning_grammar(self) -> tuple[str, ...]:
        return self._grammar

    def render_state(self) -> str:
        if self.result:
            return self.result
        keys = " ".join(f"{k}={m}" for k, m in zip(self.keys, self.middles))
        name = "links" if self.hops == 2 else "values"
        second = " ".join(f"{a}={b}" for a, b in self.second)
        query = {"learnable": self.query, "easy": f"{self.query} = {self.answer}", "impossible": "?"}[
            self.kind
        ]
        return f"keys: {keys}\n{name}: {second}\nquery: {query}"

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        rng = self.np_random
        draw = float(rng.random())
        if draw >= self.zero_variance_share:
            self.kind = "learnable"
        elif draw < self.zero_variance_share * self.easy_share:
            self.kind = "easy"
        else:
            self.kind = "impossible"
        n = self.num_pairs
        self.keys = [KEYS[int(i)] for i in sorted(rng.choice(self.num_keys, size=n, replace=False))]
        self.middles = [middle(int(i)) for i in rng.choice(self.num_middles, size=n, replace=False)]
        values = [value(int(i)) for i in rng.choice(self.num_values, size=n, replace=False)]
        firsts = self.middles if self.hops == 2 else self.keys
        order = [int(i) for i in rng.permutation(n)]
        self.second = [(firsts[i], values[i]) for i in order]
        q = int(rng.integers(n))
        self.query = self.keys[q]
        self.answer = values[q]
        self.result = ""
        self.done = False
        return {"kind": self.kind, "middle": self.middles[q], "solvable": self.kind != "impossible"}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        word = action.strip()
        if self.done or not _is_value(word, self.num_values):
            return 0.0, False, False, {"action_is_valid": False, "success": False, "kind": self.kind}
        right = self.kind != "impossible" and word == self.answer
        reward = float(right)
        if self.reward_noise and float(self.dynamics_rng.random()) < self.reward_noise:
            reward = 1.0 - reward
        self.done = True
        self.result = f"{word}: {'right' if right else 'wrong'}"
        return reward, True, False, {"action_is_valid": True, "success": right, "kind": self.kind}

    def example_action(self) -> str | None:
        return None

    def oracle_action(self) -> str | None:
        return None if self.done or self.kind == "impossible" else self.answer

    def oracle_reasoning(self, actions: Sequence[str]) -> str | None:
        """A style word drawn from ``dynamics_rng`` (so demonstrations spread over every style), then the query's
        middle and the answer: the two words of the reasoning that read the input."""
        if not actions or self.kind == "impossible":
            return None
        style = STYLES[int(self.dynamics_rng.integers(self.num_styles))]
        return f"{style} {self.middles[self.keys.index(self.query)]} {self.answer}"


def _is_value(word: str, num_values: int) -> bool:
    return (
        word.startswith("v")
        and word[1:].isdigit()
        and int(word[1:]) < num_values
        and word == value(int(word[1:]))
    )
