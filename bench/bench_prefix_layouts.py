"""The update's forward and backward under ``algo.share_prompt_prefix``'s two layouts against the plain pass.

``ragen2.models.forward`` runs a prompt that a group's rows share once: packed (``packed_prefix_hidden``: each
group's prompt and its rows' own tokens in one row under a mask, one forward) or on the prompt's cached keys
and values (``shared_prefix_hidden``: a forward per prompt length and one more). Each case is a right-padded
micro-batch of groups of rows on one prompt each, as the update sees it; a pass is the trunk's forward and
a backward through every real position. The layouts alternate within each repeat (the machine drifts), and
the table gives each one's median seconds and its ratio to the cache layout's.

Cases: the organism's shape (its shipped warm start; 4 groups × 8 rows, 30-token prompts, 8-token replies)
and the built-in model's on Bandit's shape (SmolLM2-135M; 2 groups × 8 rows, 236-token prompts, replies of
22–44 tokens). Prints a table and writes ``bench/results/prefix_layouts.json`` with the commit, the machine and
the command.

    python bench/bench_prefix_layouts.py [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from provenance import provenance

RESULTS = Path(__file__).resolve().parent / "results" / "prefix_layouts.json"
# (model, groups, rows a group, prompt tokens, shortest and longest reply)
CASES: dict[str, tuple[str, int, int, int, int, int]] = {
    "organism": ("organism-warm", 4, 8, 30, 8, 8),
    "builtin, Bandit's shape": ("builtin", 2, 8, 236, 22, 44),
}


def micro_batch(vocab: int, groups: int, rows: int, prompt: int, shortest: int, longest: int) -> Any:
    """Right-padded ids and mask of ``groups`` × ``rows`` rows, each group's rows on one prompt (seeded)."""
    gen = torch.Generator().manual_seed(0)
    sequences = []
    for _ in range(groups):
        shared = torch.randint(4, vocab, (prompt,), generator=gen)
        for _ in range(rows):
            n = int(torch.randint(shortest, longest + 1, (1,), generator=gen))
            sequences.append(torch.cat([shared, torch.randint(4, vocab, (n,), generator=gen)]))
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    return ids, mask


def load(name: str) -> Any:
    from ragen2.models import load_model
    from ragen2.organism import warm_start

    return load_model(warm_start() if name == "organism-warm" else name).train()


def seconds(model: Any, run: Callable[[], torch.Tensor], real: torch.Tensor) -> float:
    """One forward and backward through every real position."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    (run() * real[..., None]).sum().backward()
    return time.perf_counter() - start


def measure(case: tuple[str, int, int, int, int, int], repeats: int) -> dict[str, Any]:
    from ragen2.models.forward import packed_prefix_hidden, prefix_groups, shared_prefix_hidden

    name, *shape = case
    model = load(name)
    ids, mask = micro_batch(model.get_input_embeddings().weight.shape[0], *shape)
    groups = prefix_groups(ids, mask)
    layouts = {
        "plain": lambda: model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state,
        "cache": lambda: shared_prefix_hidden(model, ids, mask, groups),
        "packed": lambda: packed_prefix_hidden(model, ids, mask, groups),
    }
    real = mask.bool()
    times: dict[str, list[float]] = {k: [] for k in layouts}
    for run in layouts.values():  # warm-up
        seconds(model, run, real)
    for _ in range(repeats):
        for k, run in layouts.items():
            times[k].append(seconds(model, run, real))
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        "model": name,
        "rows": int(ids.shape[0]),
        "width": int(ids.shape[1]),
        "tokens": int(mask.sum()),
        "groups": [(len(g.rows), g.length) for g in groups],
        "seconds": times,
        "median_s": median,
        "ratio_to_cache": {k: v / median["cache"] for k, v in median.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    record = provenance()  # after the thread count is set: the one the timings ran with
    record["repeats"] = args.repeats
    record["cases"] = {label: measure(case, args.repeats) for label, case in CASES.items()}
    print("| case | plain s | cache s | packed s | packed / cache |\n|---|---|---|---|---|")
    for label, r in record["cases"].items():
        m = r["median_s"]
        print(
            f"| {label} | {m['plain']:.4f} | {m['cache']:.4f} | {m['packed']:.4f} | {m['packed'] / m['cache']:.2f} |"
        )
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
