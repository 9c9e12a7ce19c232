"""WebShop: buy the product an instruction asks for, by searching and clicking through a text shop.

Pages and clickables follow WebShop's text environment (``web_agent_site``) as RAGEN uses it:
the search page takes ``search[keywords]``; a results page lists 10 products (id, title, price)
with ``click[<id>]``, ``click[next >]`` / ``click[< prev]`` and ``click[back to search]``; an item
page shows title, price and options (``click[<option value>]``), ``click[description]``,
``click[features]``, ``click[< prev]`` (back to the results) and ``click[buy now]``, which ends the
episode. Every observation ends with the list of available actions. The purchase is scored with
WebShop's ``get_reward`` (see ``reward.py`` for its approximations); ``info["score"]`` is that raw
score, ``success`` is score >= 1, and the reward is 1 on success else 0 as in RAGEN (set
``dense_reward=True`` to get the raw score). Departures: no reviews page (there is no review data
in the generated catalogue); search is BM25 (``bm25s``) over title, bullet points and description
rather than pyserini; ``search`` is valid only on the search page, as in RAGEN's validity check.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from ragen2_envs.base import TextEnv
from ragen2_envs.options import OneOf, Range
from ragen2_envs.searchqa.retrieval import BM25Index, cached_bm25
from ragen2_envs.searchqa.text import to_charset
from ragen2_envs.webshop.catalog import (
    Goal,
    GoalSpec,
    Product,
    generate_catalog,
    generated_goal_spec,
    make_goal,
)
from ragen2_envs.webshop.data import load_webshop
from ragen2_envs.webshop.reward import purchase_score

_ACTION = re.compile(r"(search|click)\[(.*)\]", re.IGNORECASE | re.DOTALL)
MAX_KEYWORD_CHARS = 500
SPLITS = ("train", "test")
BACK, PREV, NEXT, BUY = "back to search", "< prev", "next >", "buy now"
SUB_PAGES = ("description", "features")


class WebShopEnv(TextEnv):
    """A text shop over WebShop's data or a generated catalogue."""

    default_max_turns: ClassVar[int] = 9  # reference config _6_webshop.yaml: max_turn 9
    default_max_actions_per_turn: ClassVar[int] = 1

    def __init__(
        self,
        products_path: str | None = None,
        instructions_path: str | None = None,
        num_products: Annotated[int | None, Range(1)] = None,
        catalog_seed: Annotated[int, Range(0)] = 0,
        split: Annotated[str, OneOf(SPLITS)] = "train",
        dense_reward: bool = False,
        results_per_page: Annotated[int, Range(1)] = 10,
        max_results: Annotated[int, Range(1)] = 50,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(render_mode=render_mode)
        if (products_path is None) != (instructions_path is None):
            raise ValueError(
                f"products_path={products_path!r}, instructions_path={instructions_path!r}: give both "
                "(WebShop's items_shuffle*.json and items_ins*.json) or neither (the generated catalogue)"
            )
        if max_results < results_per_page:
            raise ValueError(
                f"results_per_page={results_per_page}, max_results={max_results}: need results_per_page "
                "<= max_results"
            )
        self.dense_reward = dense_reward
        self.results_per_page = results_per_page
        self.max_results = max_results
        # every tenth goal (or product, for the generated catalogue) is held out as the test split
        self._targets: tuple[Product, ...] | tuple[GoalSpec, ...]
        if products_path is not None and instructions_path is not None:
            self.products, specs = load_webshop(products_path, instructions_path, num_products)
            self._index_key: tuple[Any, ...] = ("webshop", products_path, instructions_path, num_products)
            self._targets = self._split(specs, split)
        else:
            self.products = generate_catalog(catalog_seed, 1000 if num_products is None else num_products)
            self._index_key = ("webshop-generated", catalog_seed, len(self.products))
            self._targets = self._split(self.products, split)
        if not self._targets:
            raise ValueError(f"split={split!r} holds no goal: load more products or instructions")
        self.by_asin = {p.asin: p for p in self.products}
        self.goal: Goal | None = None
        self._page = "search"
        self._keywords = ""
        self._results: list[Product] = []
        self._page_no = 1
        self._item: Product | None = None
        self._chosen: dict[str, str] = {}
        self._done = False
        self._outcome = ""

    @staticmethod
    def _split(items: tuple[Any, ...], split: str) -> tuple[Any, ...]:
        held_out = split == "test"
        return tuple(x for i, x in enumerate(items) if (i % 10 == 0) == held_out)

    # ---- the shop --------------------------------------------------------------------------
    def _index(self) -> BM25Index:
        return cached_bm25(
            self._index_key,
            [f"{p.title}\n{' '.join(p.bullet_points)}\n{p.description}" for p in self.products],
        )

    def _page_results(self) -> list[Product]:
        start = (self._page_no - 1) * self.results_per_page
        return self._results[start : start + self.results_per_page]

    def clickables(self) -> list[str]:
        """The arguments ``click[...]`` accepts on the current page, in display order."""
        if self._done or self._page == "search":
            return []
        if self._page == "results":
            out = [BACK]
            if self._page_no > 1:
                out.append(PREV)
            if self._page_no * self.results_per_page < len(self._results):
                out.append(NEXT)
            return out + [p.asin.lower() for p in self._page_results()]
        if self._page == "item":
            assert self._item is not None
            return [BACK, PREV, *SUB_PAGES, *self._item.option_values, BUY]
        return [BACK, PREV]  # description / features

    def available_actions(self) -> list[str]:
        if self._done:
            return []
        if self._page == "search":
            return ["search[<keywords>]"]
        return [f"click[{c}]" for c in self.clickables()]

    @property
    def instructions(self) -> str:
        return (
            "You are shopping in an online store. Follow the instruction to buy a product that matches "
            "its attributes, options (such as size and color) and price limit.\n"
            "Actions (one per turn), only those listed as available:\n"
            "  search[<keywords>]  on the search page: search the store (leave out size, color and price)\n"
            "  click[<product id>]  open a product from the results\n"
            "  click[next >] / click[< prev]  next / previous results page; on a product page, "
            "click[< prev] goes back to the results\n"
            "  click[<option value>]  choose an option on a product page, one at a time\n"
            "  click[description] / click[features]  read more about the product\n"
            "  click[back to search]  start a new search\n"
            "  click[buy now]  buy the open product with the chosen options; this ends the episode\n"
            "Reward: 1 if the purchase matches the instruction on type, attributes, options and price, else 0.\n"
            "Example: <answer>search[slim fit cotton hoodie]</answer>"
        )

    def render_state(self) -> str:
        lines = [f"Instruction: {self.goal.instruction if self.goal else ''}"]
        if self._done:
            lines.append(self._outcome)
        elif self._page == "search":
            lines.append("Page: search. Type keywords to search the store.")
        elif self._page == "results":
            pages = max(1, -(-len(self._results) // self.results_per_page))
            lines.append(
                f'Page: results for "{self._keywords}", page {self._page_no} of {pages} '
                f"({len(self._results)} results)"
            )
            lines += [f"[{p.asin}] {p.title} | {p.price_tag}" for p in self._page_results()]
        elif self._page == "item":
            assert self._item is not None
            lines += [f"Page: product {self._item.asin}", self._item.title, f"Price: {self._item.price_tag}"]
            for name, values in self._item.options:
                chosen = self._chosen.get(name)
                lines.append(f"{name}: {' | '.join(values)}" + (f" (chosen: {chosen})" if chosen else ""))
        else:
            assert self._item is not None
            lines.append(f"Page: {self._page} of product {self._item.asin}")
            lines += (
                [self._item.description] if self._page == "description" else list(self._item.bullet_points)
            )
        if not self._done:
            lines.append("Available actions: " + ", ".join(self.available_actions()))
        return to_charset("\n".join(lines))

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        target = self._targets[int(self.np_random.integers(len(self._targets)))]
        if isinstance(target, Product):
            spec = generated_goal_spec(target, self.np_random)
        else:
            spec = target
        self.goal = make_goal(spec, self.by_asin[spec.asin], self.np_random)
        self._page, self._keywords, self._results, self._page_no = "search", "", [], 1
        self._item, self._chosen, self._done, self._outcome = None, {}, False, ""
        return {"target_asin": self.goal.asin}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        match = _ACTION.fullmatch(action)
        argument = match.group(2).strip().lower() if match else ""
        invalid: tuple[float, bool, bool, dict[str, Any]] = (
            0.0,
            self._done,
            False,
            {"action_is_valid": False},
        )
        if self._done or match is None or not argument:
            return invalid
        if match.group(1).lower() == "search":
            if self._page != "search":
                return invalid
            self._keywords = argument[:MAX_KEYWORD_CHARS]
            hits = self._index().top(self._keywords, self.max_results)
            self._results = [self.products[i] for i in hits]
            self._page, self._page_no, self._item, self._chosen = "results", 1, None, {}
            return 0.0, False, False, {"action_is_valid": True}
        if argument not in self.clickables():
            return invalid
        if argument == BUY:
            return self._buy()
        self._click(argument)
        return 0.0, False, False, {"action_is_valid": True}

    def _click(self, target: str) -> None:
        if target == BACK:
            self._page, self._keywords, self._results, self._item, self._chosen = "search", "", [], None, {}
        elif self._page == "results":
            if target in (NEXT, PREV):
                self._page_no += 1 if target == NEXT else -1
            else:
                self._item = next(p for p in self._page_results() if p.asin.lower() == target)
                self._page, self._chosen = "item", {}
        elif self._page == "item":
            assert self._item is not None
            if target == PREV:
                self._page, self._item, self._chosen = "results", None, {}
            elif target in SUB_PAGES:
                self._page = target
            else:
                self._chosen[self._item.option_values[target]] = target
        else:  # a sub page: "< prev" returns to the item page
            self._page = "item"

    def _buy(self) -> tuple[float, bool, bool, dict[str, Any]]:
        assert self._item is not None and self.goal is not None
        score, parts = purchase_score(self._item, self.goal, self._item.price, self._chosen)
        success = score >= 1.0
        self._done = True
        chosen = ", ".join(f"{k}: {v}" for k, v in self._chosen.items()) or "no options"
        self._outcome = f"You bought {self._item.asin} ({chosen}). Score: {score:.3f}"
        reward = score if self.dense_reward else float(success)
        info = {
            "action_is_valid": True,
            "success": success,
            "score": score,
            "purchased_asin": self._item.asin,
            "reward_info": parts,
        }
        return reward, True, False, info

    def example_action(self) -> str:
        return "search[red running shoes]"

    def oracle_action(self) -> str | None:
        """Search the target's title, open it, click each goal option it offers, buy."""
        if self._done or self.goal is None:
            return None
        target = self.goal.asin
        if self._page == "search":
            return f"search[{self.by_asin[target].title}]"
        if self._page == "results":
            ids = [p.asin for p in self._results]
            if target not in ids:
                return f"click[{BACK}]"
            page = ids.index(target) // self.results_per_page + 1
            if page == self._page_no:
                return f"click[{target.lower()}]"
            return f"click[{NEXT if page > self._page_no else PREV}]"
        if self._page == "item":
            assert self._item is not None
            if self._item.asin != target:
                return f"click[{PREV}]"
            offered = self._item.option_values
            for value in self.goal.options:
                value = value.strip().lower()
                if value in offered and self._chosen.get(offered[value]) != value:
                    return f"click[{value}]"
            return f"click[{BUY}]"
        return f"click[{PREV}]"
