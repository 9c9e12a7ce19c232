"""Peak memory of the two full-vocabulary passes at 64 rows on CPU: the MI pass's cross-scoring and the update's
log-probs (forward and backward), with SmolLM2's 49,152-token vocabulary (``tiny``) and Qwen2.5's 151,936
(``tiny-qwen2``).

Both models are 2-layer, 64-wide random models, so everything but the LM head's [positions, vocab] logits
is small: the difference between the two is what the vocabulary costs. The rows are 8 prompts × 8
reasonings (|x| = 300 tokens of which 225 are shared, |z| = 60): cross-scoring scores each reasoning under
every prompt (``cross_score``, the MI pass's function); the update scores the 64 rows' own reasonings with
entropies (``token_scores``, the update's function) and back-propagates a loss through them.

Each (model, pass) runs in a fresh process: the model and the inputs are built, the process's resident
high-water mark is reset (``/proc/self/clear_refs``), the pass runs, and its peak is the new high-water mark
minus the resident size before the pass. Prints a table and writes its run into
``bench/results/vocab_memory.json`` under ``--label``, with the commit, the machine and the command (the
file keeps the other labels' runs).

    python bench/bench_vocab_memory.py [--label current] [--models tiny tiny-qwen2] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import time
from pathlib import Path
from typing import Any

import torch
from provenance import provenance

RESULTS = Path(__file__).resolve().parent / "results" / "vocab_memory.json"
PASSES = ("cross-scoring", "update log-probs")


def _memory_mib() -> tuple[float, float]:
    """(resident high-water mark, resident now) of this process, MiB."""
    status = Path("/proc/self/status").read_text()
    hwm, rss = (int(re.search(rf"{key}:\s+(\d+)", status).group(1)) / 1024 for key in ("VmHWM", "VmRSS"))
    return hwm, rss


def _rows(vocab: int, n: int, k: int, prompt_len: int, system_len: int, z_len: int) -> list:
    gen = torch.Generator().manual_seed(0)
    system = torch.randint(vocab, (system_len,), generator=gen).tolist()
    prompts = [
        system + torch.randint(vocab, (prompt_len - system_len,), generator=gen).tolist() for _ in range(n)
    ]
    return [(x, torch.randint(vocab, (z_len,), generator=gen).tolist()) for x in prompts for _ in range(k)]


def _measure(model_name: str, which: str, shape: dict[str, int], threads: int, out: Any) -> None:
    from ragen2.diagnostics.cross_scoring import cross_score
    from ragen2.models import load_model
    from ragen2.modules.update import token_scores

    if threads:
        torch.set_num_threads(threads)
    model = load_model(model_name)
    rows = _rows(model.config.vocab_size, **shape)
    if which == "cross-scoring":
        model.eval()
        cross_score(model, rows[:2])  # first-call allocations and kernel selection, outside the peak

        def run() -> None:
            cross_score(model, rows)
    else:
        model.train()
        width = max(len(x) + len(z) for x, z in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attention, loss_mask = torch.zeros_like(ids), torch.zeros_like(ids)
        for r, (x, z) in enumerate(rows):
            ids[r, : len(x) + len(z)] = torch.tensor(x + z)
            attention[r, : len(x) + len(z)] = 1
            loss_mask[r, len(x) : len(x) + len(z)] = 1

        def run() -> None:
            _, logp, entropy = token_scores(model, ids, attention, loss_mask, 1.0, with_entropy=True)
            assert entropy is not None
            ((logp * loss_mask).sum() + 1e-3 * (entropy * loss_mask).sum()).backward()
            model.zero_grad(set_to_none=True)

    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts from the resident size
    _, before = _memory_mib()
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    peak, _ = _memory_mib()
    out.put(
        {"vocab": model.config.vocab_size, "peak_mib": round(peak - before, 1), "seconds": round(seconds, 2)}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="current", help="the run's name in the results file")
    parser.add_argument("--models", nargs="+", default=["tiny", "tiny-qwen2"])
    parser.add_argument("--n", type=int, default=8, help="distinct prompts")
    parser.add_argument("--k", type=int, default=8, help="reasonings per prompt (rows = n · k)")
    parser.add_argument("--prompt-len", type=int, default=300)
    parser.add_argument("--system-len", type=int, default=225)
    parser.add_argument("--z-len", type=int, default=60)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    shape = {
        "n": args.n,
        "k": args.k,
        "prompt_len": args.prompt_len,
        "system_len": args.system_len,
        "z_len": args.z_len,
    }
    ctx = mp.get_context("spawn")
    table = []
    for model_name in args.models:
        for which in PASSES:
            queue = ctx.Queue()
            proc = ctx.Process(target=_measure, args=(model_name, which, shape, args.threads, queue))
            proc.start()
            result = queue.get()
            proc.join()
            table.append({"model": model_name, "pass": which, **result})
    rows = args.n * args.k
    print(f"{rows} rows: {args.n} prompts × {args.k} reasonings, |x| = {args.prompt_len}, |z| = {args.z_len}")
    print(f"{'model':<12}{'vocab':>8}  {'pass':<18}{'peak MiB':>10}{'seconds':>9}")
    for row in table:
        print(
            f"{row['model']:<12}{row['vocab']:>8}  {row['pass']:<18}{row['peak_mib']:>10.1f}{row['seconds']:>9.2f}"
        )
    runs = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    runs[args.label] = {**provenance(), "setup": {**shape, "rows": rows}, "results": table}
    RESULTS.write_text(json.dumps(runs, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
