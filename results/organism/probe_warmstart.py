"""What a TwoHop model folder can do before RL: success by kind when sampled (T = 1, 400 held-out instances × 4),
the grammar's share of its reasonings, greedy accuracy of the reasoning's middle and of the value after the
right middle on 200 held-out learnable prompts, whether the answer follows the reasoning (given a reasoning
whose value is wrong, the share of answers that copy it), and the exact I(X;Z) on the organism study's 64
held-out learnable prompts (seed 0's).

    python results/organism/probe_warmstart.py [folder] [--out results/organism/warmstart_probe.json]

The folder defaults to the shipped warm start (src/ragen2/organism/warmstart).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "bench"))
from provenance import provenance  # noqa: E402

from ragen2.callbacks.diagnostics import matching_seeds  # noqa: E402
from ragen2.config import build, compose  # noqa: E402
from ragen2.data.evaluation import heldout_seeds  # noqa: E402
from ragen2.diagnostics.exact import exact_mi, grammar_logprobs  # noqa: E402
from ragen2.models.loading import load_model  # noqa: E402
from ragen2.organism import warm_start  # noqa: E402

LEARNABLE = {"kind": "learnable"}


def greedy_word(model: torch.nn.Module, tokenizer, ids: list[int]) -> str:
    with torch.no_grad():
        return tokenizer.decode([int(model(torch.tensor([ids])).logits[0, -1].argmax())]).strip()


def probe(folder: str) -> dict[str, object]:
    cfg = compose(["experiment=organism", f"model.name_or_path={folder}"])
    dm = build(cfg.data)
    dm.setup()
    tok, model = dm.tokenizer, load_model(folder).eval()
    dm.sampler.sync_weights(model)
    episodes = dm.runner.collect(dm.sampler, heldout_seeds(7, 400), 4, sample_seed=1)
    by_kind = collections.defaultdict(list)
    for episode in episodes:
        by_kind[episode.kind].append(episode.success)
    out: dict[str, object] = {f"success_{k}": sum(v) / len(v) for k, v in sorted(by_kind.items())}
    out["format"] = sum(e.turns[0].format_ok for e in episodes) / len(episodes)

    seeds = matching_seeds(3, 200, LEARNABLE, dm, "probe")
    env, style = dm.env.make(), tok.encode("so", add_special_tokens=False)
    middle = value = follows = 0
    for seed, (ids, info) in zip(seeds, dm.first_prompts(seeds)):
        env.reset(seed=seed)
        answer = env.oracle_action()
        middle += greedy_word(model, tok, ids + style) == info["middle"]
        value += (
            greedy_word(model, tok, ids + tok.encode(f"so {info['middle']}", add_special_tokens=False))
            == answer
        )
        wrong = next(f"v{i}" for i in range(16) if f"v{i}" != answer)
        forced = tok.encode(f"so {info['middle']} {wrong}</think><answer>", add_special_tokens=False)
        follows += greedy_word(model, tok, ids + forced) == wrong
    n = len(seeds)
    out |= {
        "middle_acc": middle / n,
        "value_acc_given_middle": value / n,
        "answer_copies_reasoning": follows / n,
    }
    prompts = [p for p, _ in dm.first_prompts(matching_seeds(0, 64, LEARNABLE, dm, "probe"))]
    out["exact"] = exact_mi(grammar_logprobs(model, prompts, dm.grammar_ids()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=warm_start())
    parser.add_argument("--out", type=Path, default=HERE / "warmstart_probe.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = Path(args.folder).resolve()
    shown = folder.relative_to(HERE.parents[1]) if folder.is_relative_to(HERE.parents[1]) else folder
    result = {"folder": str(shown), **probe(str(folder)), "provenance": provenance()}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
