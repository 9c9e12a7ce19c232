"""Where Z ends (docs/method.md §2): the sampled ids before the first token that touches ``</think>``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ragen2.agent.render import THINK_CLOSE


def reasoning_ids(sampled_ids: Sequence[int], decode: Callable[[Sequence[int]], str]) -> list[int] | None:
    """Z = the longest prefix of ``sampled_ids`` whose text ends at or before the first ``</think>``.

    A token that straddles the tag (``ing</`` + ``think>``) is excluded with everything after it. Returns
    None when the tag never appears (the turn has no valid Z). Prefix decodes are monotone in length, so a
    binary search needs O(log n) decodes.
    """
    cut = decode(sampled_ids).find(THINK_CLOSE)
    if cut < 0:
        return None
    lo, hi = 0, len(sampled_ids)  # invariant: prefix of length lo fits before the tag
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(decode(sampled_ids[:mid])) <= cut:
            lo = mid
        else:
            hi = mid - 1
    return list(sampled_ids[:lo])
