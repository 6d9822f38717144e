"""Transmission size of VGG-16's sparse FC layers: MoDNN's 1-D baseline vs MSCC + FGCP, side by side.

For each layer shape (fc6 4096x25088, fc7 4096x4096, fc8 1000x4096), sparsity and worker count,
one run plans the same matrix with every contender and counts the bytes that travel per inference
(inputs to the workers plus partial outputs back to the group owner, float32):

* ``rows``: the paper's baseline, contiguous blocks in proportion to ability, cutting the longer
  side into pieces (columns for fc6 and fc8, rows for fc7): the cheaper 1-D cut;
* ``short``: the other reading of the paper's "divides the weight matrix along its longer side",
  cutting the shorter side (rows of fc6 and fc8, columns of fc7);
* ``rows+GO``: the same with the GO keeping a block too (not in the paper: it shows how much of the
  saving comes from the GO computing at all);
* ``MSCC``: the co-clusters with the outliers initially assigned, before FGCP (what co-clustering
  alone saves);
* ``MSCC+FGCP``: the paper's scheme, outliers offloaded to the GO while that lowers the estimated
  makespan.

Two sparsity patterns: ``block`` (group-lasso-like: ``--blocks`` dense-ish diagonal blocks under a
random permutation, ``--outlier-fraction`` of the nonzeros scattered outside; by default as many
blocks as workers) and ``random`` (uniform, no co-cluster structure). The cost model is the
paper's (section 7.1): equal abilities of 1 GMAC/s for workers and GO unless told otherwise, WLAN
43.8 Mbit/s and 54.7 ms wake-up, SpMV below 15.8% density.

    python benchmarks/fc_transfer.py                                    # full grid, ~3 min on 2 cores
    python benchmarks/fc_transfer.py --layers fc7,fc8 --sparsities 0.9 --workers 2,4 --patterns block

Writes benchmarks/results/fc_transfer.{json,md} (or --out).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from lightning_hybrid.partition import (
    PAPER_SPARSITY_THRESHOLD,
    block_sparse_matrix,
    measure_sparsity_threshold,
    mscc_fgcp_partition,
    random_sparse_matrix,
    rows_partition,
)

LAYERS = {"fc6": (4096, 25088), "fc7": (4096, 4096), "fc8": (1000, 4096)}
PAPER_MIN_REDUCTION = 0.226


def csv_list(kind):
    return lambda text: [kind(v) for v in text.split(",") if v]


def run_one(layer: str, pattern: str, sparsity: float, workers: int, W, args, gen_s: float) -> dict:
    abilities = [1.0 + i for i in range(workers)] if args.abilities == "hetero" else [1.0] * workers
    model = dict(element_size=args.element_size, sparsity_threshold=args.sparsity_threshold)
    start = time.perf_counter()
    rows = rows_partition(W, abilities, **model)
    rows_go = rows_partition(W, abilities, go_ability=args.go_ability, **model)
    short = rows_partition(W, abilities, along="shorter", **model)
    rows_s = time.perf_counter() - start
    start = time.perf_counter()
    plan = mscc_fgcp_partition(
        W, abilities, go_ability=args.go_ability, seed=args.seed, outlier_rule=args.outlier_rule,
        max_cluster_nnz=args.max_cluster_nnz, **model,
    )
    plan_s = time.perf_counter() - start
    base, ours = rows.cost(layer), plan.cost(layer)
    info = plan.info
    row = {
        "layer": layer, "shape": list(W.shape), "pattern": pattern, "sparsity": sparsity, "workers": workers,
        "abilities": abilities, "go_ability": args.go_ability, "nnz": int(W.nnz),
        "rows_bytes": base.total_bytes, "short_bytes": short.total_bytes(), "rows_go_bytes": rows_go.total_bytes(),
        "mscc_bytes": int(sum(info["initial_bytes"])), "mscc_fgcp_bytes": ours.total_bytes,
        "reduction_vs_rows": ours.reduction_vs(base),
        "reduction_vs_short": ours.reduction_vs(short.cost(layer)),
        "reduction_vs_rows_go": ours.reduction_vs(rows_go.cost(layer)),
        "mscc_reduction_vs_rows": 1.0 - sum(info["initial_bytes"]) / base.total_bytes,
        "outliers": info["outliers"], "offloaded_nnz": info["offloaded_nnz"], "fgcp_moves": info["moves"],
        "outlier_rule": info["rule"], "formats": plan.formats(),
        "rows_makespan_s": base.makespan_s, "rows_go_makespan_s": rows_go.cost(layer).makespan_s,
        "mscc_fgcp_makespan_s": ours.makespan_s,
        "gen_s": gen_s, "rows_plan_s": rows_s, "cluster_s": info["cluster_s"], "fgcp_s": info["fgcp_s"],
        "mscc_fgcp_plan_s": plan_s,
        "costs": {"rows": base.as_dict(), "rows+go": rows_go.cost(layer).as_dict(), "mscc+fgcp": ours.as_dict()},
    }
    print(
        f"[{layer} {pattern} s={sparsity:.2f} k={workers}] rows {row['rows_bytes']} B, mscc {row['mscc_bytes']} B, "
        f"mscc+fgcp {row['mscc_fgcp_bytes']} B ({100 * row['reduction_vs_rows']:.1f}%), "
        f"gen {gen_s:.1f}s plan {plan_s:.1f}s (cluster {info['cluster_s']:.1f}s)",
        file=sys.stderr, flush=True,
    )
    return row


def markdown(rows: list[dict], pattern: str) -> str:
    lines = [
        "| layer | sparsity | workers | rows B | short B | rows+GO B | MSCC B | MSCC+FGCP B | reduction vs rows "
        "| vs short | vs rows+GO | outliers | outliers to GO | est. ms rows | est. ms MSCC+FGCP | plan s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["pattern"] != pattern:
            continue
        out_share = r["outliers"] / r["nnz"]
        to_go = r["offloaded_nnz"] / r["outliers"] if r["outliers"] else 0.0
        lines.append(
            f"| {r['layer']} | {100 * r['sparsity']:.0f}% | {r['workers']} | {r['rows_bytes']} | {r['short_bytes']} | "
            f"{r['rows_go_bytes']} | {r['mscc_bytes']} | {r['mscc_fgcp_bytes']} | **{100 * r['reduction_vs_rows']:.1f}%** | "
            f"{100 * r['reduction_vs_short']:.1f}% | {100 * r['reduction_vs_rows_go']:.1f}% | "
            f"{100 * out_share:.1f}% | {100 * to_go:.0f}% | "
            f"{1e3 * r['rows_makespan_s']:.1f} | {1e3 * r['mscc_fgcp_makespan_s']:.1f} | {r['mscc_fgcp_plan_s']:.1f} |"
        )
    return "\n".join(lines)


def summary(rows: list[dict], pattern: str) -> str:
    mine = [r for r in rows if r["pattern"] == pattern]
    if not mine:
        return ""
    parts = []
    for key, name in (("reduction_vs_rows", "rows"), ("reduction_vs_short", "short"), ("reduction_vs_rows_go", "rows+GO")):
        red = [r[key] for r in mine]
        hits = sum(v >= PAPER_MIN_REDUCTION for v in red)
        parts.append(
            f"vs {name} {100 * min(red):.1f}% .. {100 * max(red):.1f}% ({hits} of {len(mine)} reach the paper's "
            f">= {100 * PAPER_MIN_REDUCTION:.1f}%)"
        )
    return f"{pattern}: reduction " + "; ".join(parts) + "."



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=csv_list(str), default=list(LAYERS))
    parser.add_argument("--sparsities", type=csv_list(float), default=[0.7, 0.8, 0.9, 0.96])
    parser.add_argument("--workers", type=csv_list(int), default=[2, 3, 4])
    parser.add_argument("--patterns", type=csv_list(str), default=["block", "random"])
    parser.add_argument("--blocks", type=int, default=0, help="blocks of the block pattern (0: as many as workers)")
    parser.add_argument("--outlier-fraction", type=float, default=0.1)
    parser.add_argument("--abilities", choices=["equal", "hetero"], default="equal",
                        help="equal: all 1 GMAC/s; hetero: worker i has 1+i GMAC/s")
    parser.add_argument("--go-ability", type=float, default=1.0)
    parser.add_argument("--element-size", type=int, default=4)
    parser.add_argument("--sparsity-threshold", type=float, default=PAPER_SPARSITY_THRESHOLD,
                        help="fraction of zeros above which SpMV is used (paper: 0.842)")
    parser.add_argument("--outlier-rule", choices=["auto", "row", "col", "best"], default="auto")
    parser.add_argument("--max-cluster-nnz", type=int, default=None,
                        help="cluster a random sample of this many nonzeros (for layers too big to cluster whole)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    for name in args.layers:
        if name not in LAYERS:
            parser.error(f"unknown layer {name!r}; choose from {', '.join(LAYERS)}")
    for pattern in args.patterns:
        if pattern not in ("block", "random"):
            parser.error(f"unknown pattern {pattern!r}; choose block or random")

    started = time.perf_counter()
    results = []
    for layer in args.layers:
        r, c = LAYERS[layer]
        for pattern in args.patterns:
            for sparsity in args.sparsities:
                W = None
                for workers in args.workers:
                    start = time.perf_counter()
                    if pattern == "random":
                        W = W if W is not None else random_sparse_matrix(r, c, sparsity, seed=args.seed, as_sparse=True)
                    else:
                        blocks = args.blocks or workers
                        W = block_sparse_matrix(r, c, blocks, sparsity, args.outlier_fraction, seed=args.seed, as_sparse=True)
                    results.append(run_one(layer, pattern, sparsity, workers, W, args, time.perf_counter() - start))
    total_s = time.perf_counter() - started
    measured = {layer: measure_sparsity_threshold(*LAYERS[layer]) for layer in args.layers}

    blocks_note = f"{args.blocks} blocks" if args.blocks else "as many blocks as workers"
    sections = [
        f"# Sparse FC transmission size: rows baseline vs MSCC+FGCP ({datetime.now(timezone.utc):%Y-%m-%d})",
        "",
        f"`{' '.join(['python', 'benchmarks/fc_transfer.py', *sys.argv[1:]])}` on {platform.machine()} "
        f"({torch.get_num_threads()} torch threads), {total_s:.0f} s in all. Bytes per inference, float32; "
        f"abilities {args.abilities}, GO ability {args.go_ability} GMAC/s, SpMV above {args.sparsity_threshold:.3f} "
        f"sparsity (this machine measures "
        + ", ".join(f"{k} {v:.3f}" for k, v in measured.items()) + ").",
        "",
    ]
    for pattern in args.patterns:
        title = (
            f"## block pattern ({blocks_note}, {100 * args.outlier_fraction:.0f}% outliers)"
            if pattern == "block" else "## uniformly random pattern"
        )
        sections += [title, "", markdown(results, pattern), "", summary(results, pattern), ""]
    text = "\n".join(sections)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fc_transfer.md").write_text(text)
    meta = {
        "argv": sys.argv[1:], "total_s": total_s, "threads": torch.get_num_threads(),
        "measured_sparsity_threshold": measured, "paper_min_reduction": PAPER_MIN_REDUCTION,
    }
    (args.out / "fc_transfer.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
