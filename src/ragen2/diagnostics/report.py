"""``ragen2-diagnose``'s library: first-turn (X, Z) rows, their cross-scores and MI family, a report folder.

- Rows come from first turns just rolled out (``rows_from_episodes`` of
  ``ragen2.rollout.first_turn.sample_first_turns``: the project's episode runner with a sampler that
  answers turn 1 only, so X is exactly the prompt training sees) or from a run's saved rollouts
  (``rows_from_jsonl``: the records ``rollout.save_jsonl=true`` writes; Z is re-extracted from the
  sampled ids with the tokenizer, as the runner does). A file that is not such records is one line
  naming the line; a last line cut by a killed run is dropped with a warning. Other trainers' rollouts
  (TRL, verl, OpenAI chat messages) come through ``ragen2.diagnostics.readers``, with their rewards.
- ``diagnose`` cross-scores them (``cross_score``) and computes the MI family (``mi_metrics``, whose
  ``cond_entropy`` is H(Z|X)), the true prompt's retrieval rank per row, and the rows that score at least
  as well under another prompt than under their own.
- ``write_report`` writes ``metrics.json``, ``heatmap.png``, ``quadrant.png``, ``ranks.png``,
  ``rows.jsonl`` and an ``index.md`` that shows them; with rows of several steps, also the curves over
  them (``curve_point`` each: ``curves.json``, ``curves.png``). Where the rows carry rewards, the index
  shows the reward-variance picture (``reward_picture``: the share of zero-variance groups).

The quadrant (docs/method.md §1): H(Z|X) says whether the reasoning is diverse within one input, I(X;Z)
whether it depends on the input. The four regions are the paper's regimes (``ragen2.diagnostics.regimes``,
the names and codes training logs as ``diag/regime``): diverse and input-driven (healthy), diverse but
input-blind (template collapse), input-driven but low-entropy (compressed), neither (collapsed). Training
classifies relative to the run's own first pass; a single pass has none, so here the splits are absolute
and configurable (``Splits``): MI as a fraction of its ceiling log C, H(Z|X) in nats per token.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ragen2.agent.episode import Episode
from ragen2.agent.reasoning import reasoning_ids
from ragen2.diagnostics.cross_scoring import CrossScores, cross_score
from ragen2.diagnostics.mi import mi_metrics, per_token, true_rank
from ragen2.diagnostics.regimes import Regime
from ragen2.errors import ConfigError
from ragen2.log import log
from ragen2.outputs import replacing, write_atomic


@dataclass(frozen=True)
class Row:
    """One first-turn (X, Z) pair with what the report shows about it."""

    prompt_ids: tuple[int, ...]  # X: the whole turn-1 context through the forced <think>
    reasoning_ids: tuple[int, ...]  # Z: the sampled ids before </think> (non-empty)
    seed: int  # the env instance
    sample: int  # index within its group
    observation: str  # the env state shown in X (labels the prompt)
    reasoning: str  # Z decoded
    reward: float | None = None  # the trajectory's outcome, where the source records one (reward variance)


@dataclass(frozen=True)
class Splits:
    """Where the quadrant's regions meet (see the module doc)."""

    mi_fraction: float = 0.1  # I(X;Z) / log C above which reasoning counts as input-driven
    entropy: float = 0.5  # H(Z|X) in nats/token above which reasoning counts as diverse

    def __post_init__(self) -> None:
        if not 0.0 < self.mi_fraction < 1.0:
            raise ValueError(f"mi_fraction={self.mi_fraction} must lie in (0, 1): a fraction of log C")
        if self.entropy <= 0.0:
            raise ValueError(f"entropy={self.entropy} must be > 0 nats/token")

    def regime(self, cond_entropy: float, mi_fraction: float) -> Regime:
        """The paper's regime of one pass (``ragen2.diagnostics.regimes``: the same names and codes as
        ``diag/regime``), with absolute splits in place of the run's first pass."""
        return Regime.of(entropy_low=cond_entropy <= self.entropy, mi_low=mi_fraction <= self.mi_fraction)


@dataclass
class Diagnosis:
    """One pass over R rows and C distinct prompts."""

    rows: list[Row]  # [R]
    scores: CrossScores  # logp_sum [R, C], prompt_index [R], ...
    metrics: dict[str, float]  # mi_metrics plus counts, costs and the region
    rank: Tensor  # [R] the own prompt's rank among the C columns (1 = best, ties against it)
    best_other: Tensor  # [R] the best-scoring column other than the own one (-1 when C = 1)
    info: dict[str, Any] = field(default_factory=dict)  # where the rows came from, timings


def first_turn_row(ep: Episode, decode: Callable[[Sequence[int]], str]) -> Row | None:
    """The episode's turn-1 (X, Z) row, or None when its Z is missing or empty."""
    if not ep.turns:
        return None
    turn = ep.turns[0]
    z = turn.reasoning_ids
    if not z:
        return None
    return Row(tuple(turn.prompt_ids), tuple(z), ep.seed, ep.sample, turn.observation, decode(z))


def rows_from_episodes(episodes: Iterable[Episode], decode: Callable[[Sequence[int]], str]) -> list[Row]:
    """Turn-1 rows with a valid, non-empty Z, in the episodes' order."""
    return [row for ep in episodes if (row := first_turn_row(ep, decode)) is not None]


#: what ``rows_from_records`` reads of a record and of its first turn
RECORD_KEYS = frozenset({"iteration", "seed", "turns"})
TURN_KEYS = frozenset({"prompt_ids", "sampled_ids", "observation"})
_WRITTEN_BY = "Fix: rollouts=<run>/rollouts.rank0.jsonl (written with rollout.save_jsonl=true)"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``rollouts.rank<r>.jsonl`` file (``iter_records``); a ``ConfigError`` for an empty one."""
    records = list(iter_records(path))
    if not records:
        raise ConfigError(
            f"rollouts={path} holds no records. {_WRITTEN_BY}, from a run that finished an iteration"
        )
    return records


def iter_records(path: str | Path, warn: bool = True) -> Iterator[dict[str, Any]]:
    """The records of a ``rollouts.rank<r>.jsonl`` file as it is read; a ``ConfigError`` naming the line for
    anything else.

    A last line without its newline that is not JSON was cut by a run killed while writing it: it is dropped
    (with a warning naming the file and the line, when ``warn``) after the whole lines before it."""
    where = f"rollouts={path}"
    if not Path(path).is_file():
        raise ConfigError(f"{where} is not a file. {_WRITTEN_BY}, or leave it null to sample")
    with Path(path).open(errors="replace") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                if not line.endswith("\n"):  # only the last line lacks its newline
                    if warn:
                        log.warning(
                            "%s: line %d is cut short (a run stopped while writing it); diagnosing the whole "
                            "lines before it",
                            where,
                            n,
                        )
                    return
                raise ConfigError(f"{where}: line {n} is not JSON ({err.msg}). {_WRITTEN_BY}") from None
            yield _checked(record, f"{where}: line {n}")


def _checked(record: Any, where: str) -> dict[str, Any]:
    """``record`` if it has what ``rows_from_records`` reads (a saved episode), else a ``ConfigError``."""
    if not isinstance(record, dict):
        raise ConfigError(f"{where} is JSON but not a record (an object). {_WRITTEN_BY}")
    missing = RECORD_KEYS - set(record)
    turns = record.get("turns")
    if not missing and not (isinstance(turns, list) and all(isinstance(t, dict) for t in turns)):
        missing = {"turns (a list of turns)"}
    if not missing and turns:
        missing = {f"turns[0].{key}" for key in TURN_KEYS - set(turns[0])}
    if missing:
        raise ConfigError(
            f"{where} lacks {', '.join(sorted(missing))}: not a record written by rollout.save_jsonl=true. "
            f"{_WRITTEN_BY}"
        )
    return record


def chosen_iteration(records: Sequence[dict[str, Any]], iteration: int | None, path: str | Path) -> int:
    """The iteration of ``records`` to read: ``iteration`` if they hold it, their last for None."""
    iterations = sorted({int(r["iteration"]) for r in records})
    if iteration is None:
        return iterations[-1]
    if iteration not in iterations:
        raise ConfigError(
            f"iteration={iteration} is not in rollouts={path}, which holds iterations {iterations}. "
            f"Fix: iteration={iterations[-1]}, or iteration=null for the last"
        )
    return iteration


def rows_from_jsonl(
    path: str | Path,
    decode: Callable[[Sequence[int]], str],
    iteration: int | None = None,
    num_prompts: int | None = None,
    samples: int | None = None,
) -> tuple[list[Row], int]:
    """Turn-1 rows of one iteration (default: the last) of the saved-rollouts file ``path``, and that
    iteration (``rows_from_records``)."""
    records = read_jsonl(path)
    chosen = chosen_iteration(records, iteration, path)
    return rows_from_records(records, decode, chosen, num_prompts, samples), chosen


def rows_from_records(
    records: Sequence[dict[str, Any]],
    decode: Callable[[Sequence[int]], str],
    iteration: int,
    num_prompts: int | None = None,
    samples: int | None = None,
) -> list[Row]:
    """Turn-1 rows of one iteration of saved rollouts (``read_jsonl``, ``chosen_iteration``).

    Every sampled episode is used, kept by the filter or not (the MI pass reads the unfiltered batch).
    ``num_prompts`` keeps the first that many distinct prompts and ``samples`` the first that many rows
    of each.
    """
    rows: list[Row] = []
    taken: dict[tuple[int, ...], int] = {}
    for r in records:
        row = row_from_record(r, decode) if int(r["iteration"]) == iteration else None
        if row is None:
            continue
        x = row.prompt_ids
        if x not in taken and num_prompts is not None and len(taken) >= num_prompts:
            continue
        if samples is not None and taken.get(x, 0) >= samples:
            continue
        taken[x] = taken.get(x, 0) + 1
        rows.append(row)
    return rows


def row_from_record(record: dict[str, Any], decode: Callable[[Sequence[int]], str]) -> Row | None:
    """A saved episode's turn-1 row (Z re-extracted from the sampled ids, as the runner extracts it), or None
    when it has no turn or its Z is missing or empty."""
    if not record["turns"]:
        return None
    turn = record["turns"][0]
    z = reasoning_ids(turn["sampled_ids"], decode)
    if not z:
        return None
    reward = record.get("return")
    return Row(
        tuple(turn["prompt_ids"]),
        tuple(z),
        int(record["seed"]),
        int(record.get("sample", 0)),
        turn["observation"],
        decode(z),
        None if reward is None else float(reward),
    )


def diagnose(model: Any, rows: Sequence[Row], splits: Splits = Splits(), **score_kwargs: Any) -> Diagnosis:
    """Cross-score ``rows`` under ``model`` and compute the MI family; needs two distinct prompts."""
    if len({row.prompt_ids for row in rows}) < 2:
        raise ConfigError(
            f"{len(rows)} rows with a valid Z hold fewer than 2 distinct prompts: MI compares prompts. "
            "Fix: more seeds (num_seeds), more samples, or a larger rollout.max_new_tokens so that the "
            "reasoning closes with </think>"
        )
    scores = cross_score(model, [(row.prompt_ids, row.reasoning_ids) for row in rows], **score_kwargs)
    metrics = mi_metrics(scores.logp_sum, scores.prompt_index, scores.num_tokens)
    cols = scores.logp_sum.shape[1]
    token_scores = per_token(scores.logp_sum, scores.num_tokens)
    rank = true_rank(token_scores, scores.prompt_index)
    others = token_scores.clone()
    others[torch.arange(len(rows)), scores.prompt_index] = -math.inf
    best_other = others.argmax(dim=1)
    mi_fraction = metrics["mi_est"] / metrics["mi_upper_bound"]
    metrics |= {
        "rows": float(len(rows)),
        "columns": float(cols),
        "mi_fraction": mi_fraction,
        "misretrieved_rows": float((rank > 1).sum()),
        "tokens_processed": float(scores.tokens_processed),
        "token_bound": float(scores.token_bound),
        "token_bound_ratio": scores.tokens_processed / scores.token_bound,
    }
    diag = Diagnosis(list(rows), scores, metrics, rank, best_other)
    regime = splits.regime(metrics["cond_entropy"], mi_fraction)
    metrics["regime"] = float(regime)
    diag.info["region"] = regime.label
    diag.info["splits"] = asdict(splits)
    return diag


def reward_picture(rewards: Mapping[int, Sequence[float]]) -> dict[str, float]:
    """The reward-variance picture of one step's groups (group -> the rewards of every row read): the mean
    reward and the share of groups of ≥ 2 rows whose rewards are all equal (zero variance: no GRPO
    advantage, what the reward-variance filter drops)."""
    values = [r for group in rewards.values() for r in group]
    sized = [group for group in rewards.values() if len(group) >= 2]
    if not values:
        return {}
    flat = sum(1 for group in sized if max(group) == min(group))
    return {
        "reward_mean": sum(values) / len(values),
        "reward_groups": float(len(sized)),
        "zero_variance_share": flat / len(sized) if sized else math.nan,
    }


#: what a curve point holds of each step's pass (besides its step and row counts)
CURVE_KEYS = (
    "mi_est",
    "mi_fraction",
    "contrast",  # matched minus mean mismatched log-likelihood: no ceiling, unlike the MI estimate
    "cond_entropy",
    "retrieval_acc",
    "retrieval_chance",
    "zero_variance_share",
)


def curve_point(step: int, diag: Diagnosis) -> dict[str, float]:
    """One step's point on the curves over steps: the MI family and the reward picture of its pass."""
    point = {
        "step": float(step),
        "rows": diag.metrics["rows"],
        "skipped": float(diag.info.get("skipped_rows", 0)),
    }
    return point | {k: diag.metrics[k] for k in CURVE_KEYS if k in diag.metrics}


def misretrieved(diag: Diagnosis, limit: int = 10) -> list[dict[str, Any]]:
    """Rows that score at least as well under another prompt as under their own, largest margin first.

    The margin is (best other − own) in nats per token: how much better another input explains the
    reasoning. Under template collapse most rows are here, and their Z reads the same whatever X was.
    """
    token_scores = per_token(diag.scores.logp_sum, diag.scores.num_tokens)
    out = []
    for r in torch.nonzero(diag.rank > 1).flatten().tolist():
        own, other = int(diag.scores.prompt_index[r]), int(diag.best_other[r])
        out.append(
            {
                "row": r,
                "own_column": own,
                "best_other_column": other,
                "own_logp_per_token": float(token_scores[r, own]),
                "other_logp_per_token": float(token_scores[r, other]),
                "margin": float(token_scores[r, other] - token_scores[r, own]),
                "rank": int(diag.rank[r]),
            }
        )
    out.sort(key=lambda item: -item["margin"])
    return out[:limit]


def _column_labels(diag: Diagnosis) -> list[str]:
    """Each distinct prompt's observation (the first row's that has it)."""
    labels = [""] * diag.scores.logp_sum.shape[1]
    for row, j in zip(diag.rows, diag.scores.prompt_index.tolist()):
        labels[j] = labels[j] or row.observation
    return labels


def _plots(diag: Diagnosis, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    import numpy as np

    own = diag.scores.prompt_index.numpy()
    order = np.argsort(own, kind="stable")
    token_scores = per_token(diag.scores.logp_sum, diag.scores.num_tokens).numpy()
    rows, cols = token_scores.shape

    fig, axes = plt.subplots(1, 2, figsize=(12, max(3.5, 0.12 * rows + 1.5)))
    centred = token_scores - token_scores.mean(axis=1, keepdims=True)
    bounds = np.flatnonzero(np.diff(own[order])) + 0.5  # between prompt groups
    for ax, mat, label in [
        (axes[0], token_scores[order], "log p(z | x_j) / |z|"),
        (axes[1], centred[order], "minus the row mean"),
    ]:
        im = ax.imshow(mat, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.scatter(own[order], np.arange(rows), marker="x", color="red", s=12, label="own prompt")
        for b in bounds:
            ax.axhline(b, color="white", linewidth=0.6)
        ax.set(xlabel="prompt column j", ylabel="sample (grouped by its own prompt)", title=label)
        ax.set_xticks(range(cols))
        plt.colorbar(im, ax=ax)
    axes[0].legend(loc="upper right", fontsize=7)
    fig.suptitle("Cross-scores: an input-driven policy shows a bright ×-diagonal on the right")
    fig.tight_layout()
    save_png(fig, folder / "heatmap.png")
    plt.close(fig)

    m, splits = diag.metrics, diag.info["splits"]
    h, frac = m["cond_entropy"], m["mi_fraction"]
    h_max = max(2.0 * splits["entropy"], 1.25 * h, 1e-3)
    y_low, y_high = min(-0.1, frac - 0.05), 1.05
    fig, ax = plt.subplots(figsize=(6, 5))
    ax.axvline(splits["entropy"], color="grey", linestyle="--", linewidth=0.8)
    ax.axhline(splits["mi_fraction"], color="grey", linestyle="--", linewidth=0.8)
    left, right = splits["entropy"] / 2, (splits["entropy"] + h_max) / 2
    low, high = (y_low + splits["mi_fraction"]) / 2, (splits["mi_fraction"] + y_high) / 2
    for x, y, text in [
        (right, high, "healthy"),
        (right, low, "template collapse"),
        (left, high, "compressed"),
        (left, low, "collapsed"),
    ]:
        ax.text(x, y, text, ha="center", va="center", color="dimgray", rotation=90 if x == left else 0)
    ax.scatter([h], [frac], s=80, color="crimson", zorder=3)
    ax.annotate(
        f"H={h:.2f}, MI={m['mi_est']:.2f} (of log C={m['mi_upper_bound']:.2f})",
        (h, frac),
        textcoords="offset points",
        xytext=(8, 8),
        fontsize=8,
    )
    ax.set(
        xlim=(0, h_max),
        ylim=(y_low, y_high),
        xlabel="H(Z|X), nats per token (cond_entropy)",
        ylabel="I(X;Z) / log C (mi_est / mi_upper_bound)",
        title=f"This pass: {diag.info['region']}",
    )
    fig.tight_layout()
    save_png(fig, folder / "quadrant.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    counts = np.bincount(diag.rank.numpy(), minlength=cols + 1)[1:]
    ax.bar(np.arange(1, cols + 1), counts, color="steelblue", label="rows")
    ax.axhline(rows / cols, color="crimson", linestyle="--", label=f"chance (uniform, {rows / cols:.1f})")
    ax.set(
        xlabel="own prompt's rank (1 = retrieved; ties count against it)",
        ylabel="rows",
        title=f"Retrieval: {m['retrieval_acc']:.2f} at rank 1, chance {m['retrieval_chance']:.2f}",
        xticks=range(1, cols + 1),
    )
    ax.legend()
    fig.tight_layout()
    save_png(fig, folder / "ranks.png")
    plt.close(fig)


def _quote(text: str, limit: int = 300) -> str:
    """One table cell: newlines shown as ⏎, pipes escaped, cut at ``limit`` characters."""
    text = text if len(text) <= limit else text[:limit] + "…"
    return text.replace("|", "\\|").replace("\n", " ⏎ ")


SHOWN = (
    "mi_est",
    "mi_upper_bound",
    "mi_fraction",
    "cond_entropy",
    "reasoning_entropy",
    "retrieval_acc",
    "retrieval_chance",
    "retrieval_above_chance",
    "mi_zscore",
    "mi_est_seq",
    "cond_entropy_seq",
)


def _source_lines(diag: Diagnosis) -> list[str]:
    """What the index says of the rows skipped, the rewards and the curves over steps, where there are any."""
    m, info, lines = diag.metrics, diag.info, []
    skipped = info.get("skipped", {})
    if sum(skipped.values()):
        why = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in skipped.items() if n)
        lines += [f"Rows read but not scored: {sum(skipped.values())} ({why}).", ""]
    if "reward_mean" in m:
        lines += [
            "## Reward variance",
            "",
            f"Mean reward {m['reward_mean']:.4f}; {m['zero_variance_share']:.1%} of {int(m['reward_groups'])} "
            "groups have the same reward on every row (zero variance: no advantage, what the reward-variance "
            "filter drops). Over every row read, scored or not.",
            "",
        ]
    if len(info.get("curves", ())) >= 2:
        lines += [
            "## Over steps",
            "",
            f"The MI family of each of {len(info['curves'])} steps (this report's other sections: step "
            f"{info.get('step')}). Points: `curves.json`.",
            "",
            "![curves](curves.png)",
            "",
        ]
    return lines


def _index_md(diag: Diagnosis, wrong: list[dict[str, Any]]) -> str:
    m, info = diag.metrics, diag.info
    labels = _column_labels(diag)
    lines = [
        "# ragen2-diagnose report",
        "",
        f"Source: {info.get('source', '?')}. Scorer: {info.get('model', '?')}.",
        f"{int(m['rows'])} first-turn rows with a valid Z over {int(m['columns'])} distinct prompts "
        f"(chance retrieval 1/{int(m['columns'])} = {m['retrieval_chance']:.3f}).",
        "",
        f"**Region: {info['region']}** (H(Z|X) split {info['splits']['entropy']} nats/token, "
        f"MI split {info['splits']['mi_fraction']} × log C).",
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| `{k}` | {m[k]:.4f} |" for k in SHOWN),
        "",
        "All metrics: `metrics.json` (per token; `_seq` per sequence). Rows, scores and ranks: `rows.jsonl`.",
        "",
        *_source_lines(diag),
        "## The cross-score matrix",
        "",
        "Rows are samples grouped by their own prompt, columns the distinct prompts; × marks the own "
        "column. MI lives in the variation across a row (right panel): a bright ×-diagonal means each "
        "reasoning is most likely under its own input. Vertical stripes are prompts that make every "
        "reasoning more (or less) likely; the marginal absorbs them.",
        "",
        "![cross-scores](heatmap.png)",
        "",
        "## H(Z|X) × I(X;Z)",
        "",
        "Entropy alone cannot tell healthy from template collapse: both are diverse. MI separates them.",
        "",
        "![quadrant](quadrant.png)",
        "",
        "## Retrieval ranks",
        "",
        "Where the own prompt ranks among all prompts for each sample; an input-blind policy spreads "
        "evenly (the dashed line).",
        "",
        "![ranks](ranks.png)",
        "",
        f"## Samples that score at least as well under another prompt ({int(m['misretrieved_rows'])} "
        f"of {int(m['rows'])})",
        "",
        "The visible face of template collapse: the reasoning explains another input as well as its own. "
        "Margin = (best other − own) log-likelihood in nats per token.",
        "",
    ]
    if wrong:
        lines += [
            "| row | seed | own prompt's state | reasoning Z | best other prompt's state | margin | rank |",
            "|---|---|---|---|---|---|---|",
        ]
        for item in wrong:
            row = diag.rows[item["row"]]
            lines.append(
                f"| {item['row']} | {row.seed} | {_quote(row.observation, 120)} | {_quote(row.reasoning)} "
                f"| {_quote(labels[item['best_other_column']], 120)} | {item['margin']:+.3f} | {item['rank']} |"
            )
    else:
        lines.append("None: every sample is retrieved by its own prompt.")
    costs = (
        f"Cost: {int(m['tokens_processed'])} token positions run, {m['token_bound_ratio']:.2f}× the minimum "
        f"({int(m['token_bound'])})."
    )
    timings = ", ".join(f"{k} {v:.1f} s" for k, v in info.get("seconds", {}).items())
    lines += ["", "## Cost", "", costs + (f" Time: {timings}." if timings else ""), ""]
    return "\n".join(lines)


#: the files of a report folder, in the order ``write_report`` writes them
REPORT_FILES = ("metrics.json", "rows.jsonl", "heatmap.png", "quadrant.png", "ranks.png", "index.md")
#: written beside them when the rows span several steps
CURVE_FILES = ("curves.json", "curves.png")


def save_png(fig: Any, path: Path) -> None:
    """A figure written as ``write_atomic`` writes text: beside ``path``, fsynced, renamed into place (a failure
    keeps the earlier image)."""
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
        with tmp.open("rb") as f:
            os.fsync(f.fileno())


def write_report(diag: Diagnosis, folder: str | Path, limit: int = 10) -> Path:
    """Write the report folder (``REPORT_FILES``); returns it. Every file is written atomically
    (``ragen2.outputs.write_atomic``, ``save_png``): a failure keeps each one's earlier version, or none."""
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    wrong = misretrieved(diag, limit)
    record = {
        "metrics": diag.metrics,
        "region": diag.info["region"],
        "splits": diag.info["splits"],
        "misretrieved": wrong,
        **{k: v for k, v in diag.info.items() if k not in ("region", "splits")},
    }
    write_atomic(folder / "metrics.json", json.dumps(record, indent=2) + "\n")
    token_scores = per_token(diag.scores.logp_sum, diag.scores.num_tokens)
    items = (
        {
            "seed": row.seed,
            "sample": row.sample,
            "column": int(diag.scores.prompt_index[r]),
            "rank": int(diag.rank[r]),
            "num_tokens": int(diag.scores.num_tokens[r]),
            "logp_per_token": [round(v, 5) for v in token_scores[r].tolist()],
            "reasoning": row.reasoning,
        }
        for r, row in enumerate(diag.rows)
    )
    write_atomic(folder / "rows.jsonl", "".join(json.dumps(item) + "\n" for item in items))
    _plots(diag, folder)
    curves = diag.info.get("curves", [])
    if len(curves) >= 2:
        write_atomic(folder / "curves.json", json.dumps(curves, indent=2) + "\n")
        _curves_plot(curves, folder / "curves.png")
    else:
        for name in CURVE_FILES:  # an earlier report's curves would read as this one's
            (folder / name).unlink(missing_ok=True)
    write_atomic(folder / "index.md", _index_md(diag, wrong))
    return folder


def _curves_plot(curves: Sequence[Mapping[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [p["step"] for p in curves]
    panels = [
        ("mi_fraction", "I(X;Z) / log C"),
        ("contrast", "contrast, nats/token"),
        ("retrieval_acc", "retrieval (rank 1)"),
        ("cond_entropy", "H(Z|X), nats/token"),
        ("zero_variance_share", "zero-variance groups"),
    ]
    panels = [(k, label) for k, label in panels if any(k in p for p in curves)]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        ax.plot(steps, [p.get(key, math.nan) for p in curves], marker="o", color="steelblue")
        if key == "retrieval_acc":
            ax.plot(
                steps,
                [p.get("retrieval_chance", math.nan) for p in curves],
                "--",
                color="crimson",
                label="chance",
            )
            ax.legend(fontsize=7)
        ax.set(xlabel="step", title=label)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
