"""The names of the MI curves a run logs (``diag/<curve>/*``).

A leaf: the diagnostics that write the curves and the torch-free grid tables that read them back share one
pattern without the tables importing the diagnostics package (which loads torch).
"""

from __future__ import annotations

import re

CURVE = re.compile(r"(first_turn|trajectory|heldout|turn_([2-9]|[1-9]\d+))(_c([2-9]|[1-9]\d+))?")
"""Curves the MI pass logs: ``first_turn``, ``trajectory``, ``turn_<t>`` for t ≥ 2, ``heldout``, and each one's
``_c<n>`` over its first n prompts (``diagnostics.columns``)."""
