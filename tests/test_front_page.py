"""The README is a front page: at most 900 words, and each row of its ``## Results`` table at most 60.

Words are counted as a reader sees the page: a link counts its text and not its target, Markdown's marks
(``**``, backticks, ``#``, list dashes, the table's pipes and its rule row) are not words, the code blocks
count (the reader reads the commands and the sample output), and a word is a whitespace-separated piece
holding at least one letter or digit, so a lone "×", "=" or "…" is not one. A row's words are those of both
its cells. The conditions and caveats behind a row belong on the page it links.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_evidence import CELL, results_table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_WORDS = 900
MAX_ROW_WORDS = 60

LINK = re.compile(r"!?\[([^\]]*)\]\([^)\s]*\)")  # [text](target) -> text
RULE = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")  # a table's |---|---| line
FENCE = re.compile(r"^\s*```")


def words(markdown: str) -> int:
    """How many words a reader sees in ``markdown`` (the module docstring says how they are counted)."""
    seen = []
    for line in markdown.splitlines():
        if FENCE.match(line) or RULE.match(line):
            continue
        line = LINK.sub(r"\1", line)
        line = re.sub(r"^\s*(#+|[-*+])\s+", "", line)  # a heading's or a list item's mark
        line = CELL.sub(" ", line).replace("\\|", "|")
        seen += line.replace("**", "").replace("`", "").split()
    return sum(1 for word in seen if re.search(r"\w", word))


def row_words(what: str, number: str) -> int:
    return words(what) + words(number)


def test_the_readme_is_at_most_900_words() -> None:
    count = words(README.read_text())
    assert count <= MAX_WORDS, (
        f"README.md has {count} words, over {MAX_WORDS}: move conditions, caveats and history to the docs page "
        "the text links, and keep the front page to what ragen2 is, the two commands and the headline numbers"
    )


def test_each_headline_row_is_at_most_60_words() -> None:
    rows = results_table(README.read_text())
    assert 1 <= len(rows) <= 8, f"the README's ## Results table has {len(rows)} rows: at most eight headlines"
    long = {what: row_words(what, number) for what, number in rows if row_words(what, number) > MAX_ROW_WORDS}
    assert long == {}, (
        f"README results rows over {MAX_ROW_WORDS} words (move the rest to the linked page): {long}"
    )


def test_words_are_counted_as_a_reader_sees_them() -> None:
    # a link is its text; marks, pipes, the rule row and a lone symbol are no words; code counts
    assert words("[Benchmarks](docs/benchmarks.md#gpus) **0.47×** `top_p` vs `none` × …") == 5
    assert words("## Results\n\n| what | number |\n|---|---|\n| a b | 1 s (\\| 2) ( |\n") == 8
    assert words("- one item\n\n```bash\nbash scripts/test.sh --fast\n```\n") == 5
    head = "# x\n\n## Results\n\n| what | number |\n|---|---|\n"
    [(what, number)] = results_table(head + f"| a row | {'word ' * 58}([f](bench/results/x.json)) |\n")
    assert row_words(what, number) == 61
