"""HF sampler benchmarks; each part writes its own entry of bench/results/sampler.json.

``decode``: decode steps per second (one new token for each of b rows) against what the machine allows,
measured in the same run. Per step a decoder reads every weight once (the LM head included; an untied
input embedding only for b rows) and every row's keys/values at its attended positions, and runs
2 × b × (matmul weights) + 4 × layers × heads × head_dim × Σ context FLOPs. The bandwidth is a large tensor
copy (read + write bytes ÷ time), the FLOP rate the model's own GEMM shapes (one layer's projections ×
layers, plus the LM head) at a large row count. Printed: the bandwidth bound (bytes ÷ bandwidth, the
issue's) and the roofline bound (max of bytes ÷ bandwidth and FLOPs ÷ FLOP rate), the achieved rate as a
fraction of each, and the rate of the step's GEMMs alone at b rows (what the matmul kernels allow): launched
one by one; on CUDA also replayed from one CUDA graph (no launch cost, as the sampler's recorded step runs
them), and fused (q/k/v as one matmul, gate/up as one: what fusing those projections would allow).
``--compile`` adds the sampler with ``rollout.sampler.compile=true``, ``--fuse`` each current sampler with
``rollout.sampler.fuse_projections=true`` (those matmuls fused in the sampler itself).
``--baseline REF`` runs the sampler of commit REF (its ``rollout/hf.py`` and ``models/kv.py``, read with
git) beside the current one, interleaved, on the same prompts and seed; both must sample the same ids on
the CPU. A step's time is the interval between two consecutive decode forwards (the whole loop body),
its median over the call taken per round (robust to a neighbour's burst on a shared machine), the best
round kept. Prompts are Sokoban's turn-1 prompts (8 groups: ~300 tokens), each group's rows
sharing one.

``prefix``: prefix reuse (group prompts encoded once, each turn extends the last) vs plain re-prefill
over the same Sokoban collection; prompt tokens prefilled, seconds and their ratios; the sampled ids
must be identical.

  python bench/bench_sampler.py decode [--grid 4x4,8x16] [--tokens 16] [--rounds 3] [--baseline 0bbda19] [--compile] [--fuse]
  python bench/bench_sampler.py decode --device cuda --shape qwen2.5-3b --tokens 64   # random bf16 weights
      (--baseline FOLDER where git history is missing: git show 0bbda19:src/ragen2/rollout/hf.py > FOLDER/hf.py,
      the same for src/ragen2/models/kv.py)
  python bench/bench_sampler.py prefix [--groups 2] [--group-size 4] [--turns 3] [--tokens 32]
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from provenance import cpu_name, provenance

from ragen2._env import set_defaults

set_defaults()

import torch  # noqa: E402

from ragen2.models.loading import load_model, load_tokenizer  # noqa: E402
from ragen2.rollout.base import Sample, SamplingParams  # noqa: E402
from ragen2.rollout.hf import HFSampler  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "sampler.json"


# ---- the machine ---------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def copy_bandwidth(device: torch.device, megabytes: int) -> float:
    """Bytes per second of a large copy, read + write."""
    src = torch.ones(megabytes * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _best(lambda: dst.copy_(src), device, 5)


#: a decoder layer's linears that read one input (Llama's and Qwen2's names): one matmul each when fused
FUSABLE = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def linear_shapes(model: Any, fused: bool = False) -> tuple[list[tuple[int, int]], tuple[int, int], int]:
    """(in, out) of one decoder layer's linears (``fused``: each FUSABLE group as one, its outputs side by
    side), of the LM head, and the layer count."""
    layers = model.model.layers
    named = [
        (n.rsplit(".", 1)[-1], m) for n, m in layers[0].named_modules() if isinstance(m, torch.nn.Linear)
    ]
    shapes: dict[str, tuple[int, int]] = {}  # by the name of its group's first linear (or its own)
    for name, m in named:
        group = next((g for g in FUSABLE if name in g), (name,)) if fused else (name,)
        first = next((n for n in group if n in shapes), name)
        i, o = shapes.get(first, (m.in_features, 0))
        shapes[first] = (i, o + m.out_features)
    head = model.get_output_embeddings()
    return list(shapes.values()), (head.in_features, head.out_features), len(layers)


def _graphed(fn: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """``fn`` recorded as one CUDA graph, replayed (its kernels without their launch cost); ``fn`` elsewhere."""
    if device.type != "cuda":
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # cuBLAS picks its kernels and workspace before the recording
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def gemm_seconds(
    model: Any, rows: int, device: torch.device, dtype: torch.dtype, fused: bool = False, graph: bool = False
) -> tuple[float, float]:
    """(FLOPs, seconds) of all the model's matmuls on ``rows`` rows: one layer's × layers, plus the head;
    ``fused``: with FUSABLE groups as one matmul each; ``graph``: replayed from a CUDA graph (on CUDA)."""
    layer, head, n_layers = linear_shapes(model, fused)
    gen = torch.Generator(device=device).manual_seed(0)

    def make(shapes: Sequence[tuple[int, int]]) -> Callable[[], None]:
        xs = [torch.randn(rows, i, device=device, dtype=dtype, generator=gen) for i, _ in shapes]
        ws = [torch.randn(o, i, device=device, dtype=dtype, generator=gen) for i, o in shapes]

        def run() -> None:
            for x, w in zip(xs, ws, strict=True):
                torch.nn.functional.linear(x, w)

        return _graphed(run, device) if graph else run

    t_layer, t_head = _best(make(layer), device, 3), _best(make([head]), device, 3)
    flops = 2 * rows * (n_layers * sum(i * o for i, o in layer) + head[0] * head[1])
    return flops, n_layers * t_layer + t_head


def step_cost(model: Any, prompt_lens: Sequence[int], steps: int) -> dict[str, float]:
    """Bytes read and FLOPs of one decode step, averaged over ``steps`` steps after prompts of these lengths."""
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    n_layers = cfg.num_hidden_layers
    unique = {p.data_ptr(): p for p in model.parameters()}.values()  # a tied head counts once
    weight_bytes = sum(p.numel() * p.element_size() for p in unique)
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if embed.data_ptr() != head.data_ptr():
        weight_bytes -= embed.numel() * embed.element_size()  # a lookup reads b of its rows
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    b = len(prompt_lens)
    context = sum(n + (steps + 1) / 2 for n in prompt_lens)  # Σ rows' attended positions, mean over steps
    kv_bytes = 2 * n_layers * kv_heads * head_dim * head.element_size() * context
    flops = 2 * b * matmul + 4 * n_layers * heads * head_dim * context
    return {"weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "flops": flops}


# ---- the samplers --------------------------------------------------------------------------------------
def baseline_sampler(ref: str) -> type | None:
    """``HFSampler`` as commit ``ref`` had it (with that commit's ``models/kv.py``), or as the files
    ``hf.py`` and ``kv.py`` in the folder ``ref`` hold it (a machine without the git history); None if
    neither can be read."""

    def show(path: str) -> str:
        if Path(ref).is_dir():
            return (Path(ref) / Path(path).name).read_text()
        return subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ref}:{path}"], capture_output=True, text=True, check=True
        ).stdout

    try:
        kv_src, hf_src = show("src/ragen2/models/kv.py"), show("src/ragen2/rollout/hf.py")
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"no baseline: {ref} cannot be read ({error})")
        return None
    # its own module names, and its attention registered under its own name
    kv_src = kv_src.replace('"ragen2_grouped_sdpa"', '"ragen2_grouped_sdpa_baseline"')
    hf_src = hf_src.replace("from ragen2.models.kv import", "from ragen2_baseline_kv import")
    for name, src in (("ragen2_baseline_kv", kv_src), ("ragen2_baseline_hf", hf_src)):
        module = types.ModuleType(name)
        sys.modules[name] = module
        exec(compile(src, f"{ref}:{name}", "exec"), module.__dict__)
    return sys.modules["ragen2_baseline_hf"].HFSampler


def sokoban_prompts(tokenizer: Any, groups: int, group_size: int, tokens: int) -> list[list[int]]:
    """The runner's turn-1 Sokoban prompts for instance seeds 0 … groups − 1, each ``group_size`` times.

    Without the envs' dependencies (gymnasium: a GPU machine as its image stands), random ids of the same
    length (300) stand in; the decode step's cost depends on the lengths only."""
    try:
        import ragen2_envs
    except ImportError as error:
        print(f"no Sokoban prompts ({error}): random 300-token prompts instead")
        gen = torch.Generator().manual_seed(0)
        firsts = [torch.randint(1000, len(tokenizer), (300,), generator=gen).tolist() for _ in range(groups)]
        return [p for p in firsts for _ in range(group_size)]

    from ragen2.agent.runner import AgentConfig, EpisodeRunner

    class Capture:
        needs_oracle, records_entropy = False, True

        def __init__(self) -> None:
            self.prompts: list[list[int]] = []

        def generate(self, prompts: Any, params: Any, seed: int, meta: Any = None) -> list[Sample]:
            self.prompts = [list(p) for p in prompts]
            return [Sample(ids=[tokenizer.eos_token_id], finish_reason="eos") for _ in prompts]

        def sync_weights(self, model: Any) -> None:
            pass

    capture = Capture()
    runner = EpisodeRunner(
        lambda: ragen2_envs.make("ragen2/Sokoban-v0"),
        tokenizer,
        AgentConfig(max_turns=1),
        SamplingParams(max_new_tokens=tokens),
        env_id="ragen2/Sokoban-v0",
    )
    runner.collect(capture, list(range(groups)), group_size, sample_seed=0)
    return capture.prompts


def random_model(shape: str, device: torch.device, dtype: torch.dtype) -> Any:
    """A published shape (bench_gpu.SHAPES) with random weights, built on ``device``."""
    import transformers
    from bench_gpu import SHAPES

    cls, kwargs = SHAPES[shape]
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            getattr(transformers, cls)(**kwargs), dtype=dtype, attn_implementation="sdpa"
        )
    return model.eval()


def decode_steps(
    cls: Callable[..., Any],
    tokenizer: Any,
    model: Any,
    prompts: list[list[int]],
    params: SamplingParams,
    device: torch.device,
) -> tuple[list[float], list[Sample]]:
    """Seconds of each decode step of one generate call (all rows in one batch), and its samples.

    A step is the interval between the starts of two consecutive forwards over all rows after the
    prefill's (forward, draw, stop check: the whole loop body), read by a forward pre-hook, the same for
    any sampler. A step replayed from a CUDA graph calls no forward: then the sampler's own decode time
    (which ends on a device sync), spread evenly over its steps."""
    starts: list[float] = []

    def stamp(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids")
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if ids is not None and ids.shape[0] == len(prompts) and not capturing:
            _sync(device)
            starts.append(time.perf_counter())

    hook = model.register_forward_pre_hook(stamp, with_kwargs=True)
    sampler = cls(tokenizer, model, max_batch_size=len(prompts))
    try:
        out = sampler.generate(prompts, params, seed=0)
    finally:
        hook.remove()
    steps = [b - a for a, b in itertools.pairwise(starts[1:])]  # starts[0]: the batch's prefill
    if len(steps) < 2 and getattr(sampler, "decode_steps", 0):
        steps = [sampler.decode_seconds / sampler.decode_steps] * sampler.decode_steps
    del sampler  # its held keys/values (GBs at 128 rows) go before the next call allocates its own
    gc.collect()
    return steps, out


def decode(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    if args.shape:  # the shape's own tokenizer (Qwen2.5's for the Qwen shapes): its prompts' lengths
        from bench_gpu import shape_tokenizer

        tokenizer = shape_tokenizer(args.shape, Path(tempfile.mkdtemp(prefix="tokenizer-")))
    else:
        tokenizer = load_tokenizer(args.model)
    if args.shape:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model, name = random_model(args.shape, device, dtype), f"{args.shape} (random weights)"
    else:
        model, name = load_model(args.model).to(device).eval(), args.model
    dtype = next(model.parameters()).dtype
    impls: dict[str, Callable[..., Any]] = {"current": HFSampler}
    if args.compile:  # the same sampler with its fixed-shape step through torch.compile
        step = "graph" if device.type == "cuda" else "static"
        impls["current, compiled"] = functools.partial(HFSampler, compile=True, decode_step=step)
    if args.fuse:  # and with q/k/v and gate/up fused (rollout.sampler.fuse_projections)
        for label, cls in list(impls.items()):
            impls[f"{label}, fused"] = functools.partial(cls, fuse_projections=True)
    if args.baseline != "none":
        old = baseline_sampler(args.baseline)
        if old is not None:
            impls = {f"baseline {args.baseline}": old, **impls}
    cpu = f"{cpu_name()}, {os.cpu_count()} cores"
    machine = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "copy_bandwidth_GBps": copy_bandwidth(device, 4096 if device.type == "cuda" else 512) / 1e9,
    }
    flops_big, t_big = gemm_seconds(
        model, args.gemm_rows or (8192 if device.type == "cuda" else 512), device, dtype
    )
    machine["gemm_GFLOPps"] = flops_big / t_big / 1e9
    print(f"{name} on {machine['device']} ({dtype}): copy {machine['copy_bandwidth_GBps']:.1f} GB/s, "
          f"GEMM {machine['gemm_GFLOPps']:.1f} GFLOP/s")  # fmt: skip
    rows_out = []
    for spec in args.grid.split(","):
        groups, group_size = (int(x) for x in spec.lower().split("x"))
        prompts = sokoban_prompts(tokenizer, groups, group_size, args.tokens)
        b = len(prompts)
        params = SamplingParams(max_new_tokens=args.tokens)
        times: dict[str, list[float]] = {k: [] for k in impls}  # every round's median step
        ids: dict[str, list[list[int]]] = {}
        steps = 0
        for _ in range(args.rounds):
            for label, cls in impls.items():
                step_s, out = decode_steps(cls, tokenizer, model, prompts, params, device)
                steps = max(len(s.ids) for s in out) - 1
                times[label].append(statistics.median(step_s))
                ids[label] = [s.ids for s in out]
                print(f"{spec} {label}: median step {times[label][-1]:.3f} s of {len(step_s)}", flush=True)
        cost = step_cost(model, [len(p) for p in prompts], steps)
        bytes_ = cost["weight_bytes"] + cost["kv_bytes"]
        t_bw = bytes_ / (machine["copy_bandwidth_GBps"] * 1e9)
        t_flops = cost["flops"] / (machine["gemm_GFLOPps"] * 1e9)
        _, t_gemm = gemm_seconds(model, b, device, dtype)
        cuda = device.type == "cuda"
        # a recording that fails costs these two columns, not the step's numbers; on the CPU a graph would be
        # the same launches, so the graphed column is left out there rather than timed twice
        try:
            t_graphed = gemm_seconds(model, b, device, dtype, graph=True)[1] if cuda else None
            t_fused = gemm_seconds(model, b, device, dtype, fused=True, graph=cuda)[1]
        except RuntimeError as error:
            print(f"GEMMs graphed and fused not measured: {error}", flush=True)
            t_graphed = t_fused = None
        row: dict[str, Any] = {
            "grid": spec,
            "rows": b,
            "prompt_tokens": sorted({len(p) for p in prompts}),
            "decode_steps": steps,
            **cost,
            "bound_bandwidth_steps_per_s": 1 / t_bw,
            "bound_roofline_steps_per_s": 1 / max(t_bw, t_flops),
            "bound_is": "compute" if t_flops > t_bw else "bandwidth",
            "gemms_alone_steps_per_s": 1 / t_gemm,
            "gemms_graphed_steps_per_s": t_graphed and 1 / t_graphed,
            "gemms_fused_steps_per_s": t_fused and 1 / t_fused,
            "impls": {},
        }
        for label, ts in times.items():
            rate = 1 / min(ts)
            row["impls"][label] = {
                "median_step_s_per_round": ts,
                "steps_per_s": rate,
                "tokens_per_s": rate * b,
                "fraction_of_bandwidth_bound": rate * t_bw,
                "fraction_of_roofline_bound": rate * max(t_bw, t_flops),
            }
        base = next(iter(times))
        if base.startswith("baseline"):
            for label in list(times)[1:]:
                row["impls"][label]["speedup_median_per_round"] = statistics.median(
                    o / n for o, n in zip(times[base], times[label], strict=True)
                )
                row["impls"][label]["identical_ids_to_baseline"] = ids[base] == ids[label]
            row["speedup_median_per_round"] = row["impls"]["current"]["speedup_median_per_round"]
            row["identical_ids"] = row["impls"]["current"]["identical_ids_to_baseline"]
            if device.type == "cpu":
                assert row["identical_ids"], "the current sampler drew different ids than the baseline"
        rows_out.append(row)
        print(table(rows_out), flush=True)
    return {"model": name, "dtype": str(dtype), "tokens": args.tokens, "rounds": args.rounds, **machine,
            "grids": rows_out}  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    head = ["rows", "impl", "steps/s", "tok/s", "bw bound", "of bw", "roofline", "of roofline", "GEMMs alone"]
    head += ["graphed", "fused"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        for label, m in r["impls"].items():
            cells = [
                f"{r['grid']} = {r['rows']}",
                label,
                f"{m['steps_per_s']:.2f}",
                f"{m['tokens_per_s']:,.0f}",
                f"{r['bound_bandwidth_steps_per_s']:.2f}",
                f"{m['fraction_of_bandwidth_bound']:.0%}",
                f"{r['bound_roofline_steps_per_s']:.2f} ({r['bound_is']})",
                f"{m['fraction_of_roofline_bound']:.0%}",
                f"{r['gemms_alone_steps_per_s']:.2f}",
                *(
                    f"{r[k]:.2f}" if r[k] else "–"
                    for k in ("gemms_graphed_steps_per_s", "gemms_fused_steps_per_s")
                ),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- prefix reuse --------------------------------------------------------------------------------------
def prefix(args: argparse.Namespace) -> dict[str, Any]:
    import ragen2_envs

    from ragen2.agent.runner import AgentConfig, EpisodeRunner

    tokenizer, model = load_tokenizer(args.model), load_model(args.model)
    runner = EpisodeRunner(
        lambda: ragen2_envs.make("ragen2/Sokoban-v0"),
        tokenizer,
        AgentConfig(max_turns=args.turns),
        SamplingParams(max_new_tokens=args.tokens),
        env_id="ragen2/Sokoban-v0",
    )
    seeds = list(range(args.groups))
    results: dict[str, dict[str, float]] = {}
    ids: dict[str, list[list[int]]] = {}
    for _ in range(args.rounds):
        for name, reuse in (("re-prefill", False), ("prefix reuse", True)):
            sampler = HFSampler(tokenizer, model, reuse_prefix=reuse)
            start = time.perf_counter()
            episodes = runner.collect(sampler, seeds, args.group_size, sample_seed=0)
            seconds = time.perf_counter() - start
            best = results.get(name, {}).get("seconds", float("inf"))
            results[name] = {
                "seconds": min(seconds, best),
                "prefilled_tokens": float(sampler.tokens_prefilled),
            }
            ids[name] = [t.sampled_ids for ep in episodes for t in ep.turns]
    assert ids["re-prefill"] == ids["prefix reuse"], "prefix reuse changed the samples"
    base = results["re-prefill"]
    print(f"{'method':<14} {'seconds':>9} {'prefilled':>10} {'time ratio':>11} {'token ratio':>12}")
    for name, r in results.items():
        print(
            f"{name:<14} {r['seconds']:>9.1f} {r['prefilled_tokens']:>10.0f} "
            f"{base['seconds'] / r['seconds']:>10.2f}x {base['prefilled_tokens'] / r['prefilled_tokens']:>11.2f}x"
        )
    args_out = {k: getattr(args, k) for k in ("model", "groups", "group_size", "turns", "tokens", "rounds")}
    return {"args": args_out, "results": results, "identical_samples": True}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parts = parser.add_subparsers(dest="part", required=True)
    d = parts.add_parser("decode")
    d.add_argument("--model", default="builtin")
    d.add_argument("--shape", default="", help="a bench_gpu.SHAPES name: random weights instead of --model")
    d.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    d.add_argument("--grid", default="4x4,8x16", help="groups x group size, comma-separated")
    d.add_argument("--tokens", type=int, default=16)
    d.add_argument("--rounds", type=int, default=3)
    d.add_argument(
        "--baseline",
        default="0bbda19",
        help="a commit (or a folder with its hf.py, kv.py) to run beside, or none",
    )
    d.add_argument(
        "--compile", action="store_true", help="also the current sampler with rollout.sampler.compile=true"
    )
    d.add_argument(
        "--fuse",
        action="store_true",
        help="also each current sampler with rollout.sampler.fuse_projections=true",
    )
    d.add_argument(
        "--gemm-rows", type=int, default=0, help="rows of the FLOP-rate GEMMs (0: 512 CPU, 8192 GPU)"
    )
    d.add_argument("--out", default=str(RESULTS))
    p = parts.add_parser("prefix")
    p.add_argument("--model", default="builtin")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.is_file() else {}
    record = {"provenance": provenance()}  # each entry its own: the parts run at different times
    if args.part == "decode":
        key = f"{args.device.split(':')[0]}:{args.shape or args.model}"
        data.setdefault("decode", {})[key] = record | decode(args)
    else:
        data["prefix_reuse"] = record | prefix(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
