"""Do class activation maps point at the atrophy? HiResCAM and Grad-CAM scored side by side on the ADNI-like
benchmark against each subject's atrophy mask.

    python benchmarks/gradcam_localisation.py --runs benchmarks/results/adni_recipe_runs/single_seed*
    python benchmarks/gradcam_localisation.py            # trains one run first (the recipe's settings, seed 0)

For every trained run (its best checkpoint) and every AD test subject of its cohort
(``lightning-hybrid data make-adni-like`` keeps each session's atrophy mask and brain mask beside its
image), the map of the AD class at the default layer (the last whose cells are at most 8 mm:
``layer1_0``, 4 voxels of 2 mm), by each method (``hirescam``: the layer's activations weighted by the
score's gradient voxel by voxel; ``gradcam``: by each channel's mean gradient), is scored against the
mask, resampled onto the map's grid:

* pointing game: the map's peak inside the atrophy mask dilated by one cell (8 mm);
* energy ratio: the share of the map's sum over the brain inside the mask, over the mask's share of
  the brain (1 = no better than a uniform map);
* AUROC of the map's values, mask voxels against the rest of the brain (0.5 = chance).

Prints a markdown table per run and pooled, writes ``benchmarks/results/gradcam_localisation.{json,md}``
and, with ``--figure PATH``, the overlay of the subject with the median energy ratio (mask outlined).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import torch
from nibabel.processing import resample_from_to

from lightning_hybrid.data.adni_like import BRAIN_SUFFIX, IMAGE_SUFFIX, MASK_SUFFIX
from lightning_hybrid.explain import MAX_CELL_MM, METHODS, default_layer, grad_cam_map, localisation_scores, run_config


def best_checkpoint(run: Path) -> Path:
    checkpoints = sorted(p for p in (run / "checkpoints").glob("epoch*.ckpt"))
    if not checkpoints:
        raise SystemExit(f"{run}: no epoch*.ckpt in checkpoints/ (train with callbacks=[model_checkpoint,...])")
    return checkpoints[-1]  # save_top_k=1: the best one by val/bacc


def on_grid(path: Path, reference: nib.Nifti1Image) -> np.ndarray:
    """A mask resampled (nearest) onto the preprocessed volume's grid."""
    return np.asarray(resample_from_to(nib.load(path), reference, order=0).dataobj) > 0


def score_run(run: Path, limit: int | None) -> list[dict]:
    from hydra.utils import instantiate

    cfg = run_config(run)
    datamodule = instantiate(cfg.data, _convert_="all")
    splits = datamodule.read_splits()
    net = instantiate(cfg.model, _convert_="all")
    state = torch.load(best_checkpoint(run), map_location="cpu", weights_only=True)["state_dict"]
    net.load_state_dict({k[len("net."):]: v for k, v in state.items() if k.startswith("net.")})
    disease = datamodule.positive_class
    spacing = max(datamodule.view.spacing)
    preprocess = datamodule.preprocessing(keep_meta=True)
    scores = []
    for scan in [s for s in splits["test"] if s.label == disease][:limit]:
        volume = preprocess({"image": str(scan.path)})["image"]
        x = torch.as_tensor(volume)[None]
        layer = default_layer(net, x, max_stride=max(1, int(MAX_CELL_MM // spacing)))
        reference = nib.Nifti1Image(np.zeros(x.shape[2:], np.float32), np.asarray(volume.affine, dtype=np.float64))
        base = str(scan.path).removesuffix(IMAGE_SUFFIX)
        mask, brain = on_grid(Path(base + MASK_SUFFIX), reference), on_grid(Path(base + BRAIN_SUFFIX), reference)
        tolerance = int(round(MAX_CELL_MM / spacing))
        with torch.no_grad():
            probability = float(torch.softmax(net(x.float()), dim=1)[0, disease])
        for method in METHODS:
            heatmap = grad_cam_map(net, x, disease, layer, method)
            scores.append({"run": run.name, "method": method, "participant": scan.participant, "session": scan.session,
                           "layer": layer, "p_disease": probability, **localisation_scores(heatmap, mask, brain, tolerance),
                           "image": str(scan.path), "volume": volume[0].numpy(), "heatmap": heatmap, "mask": mask})
    return scores


def summary(rows: list[dict]) -> dict:
    return {
        "subjects": len(rows),
        "pointing": statistics.fmean(r["pointing"] for r in rows),
        "energy_ratio_median": statistics.median(r["energy_ratio"] for r in rows),
        "energy_ratio_mean": statistics.fmean(r["energy_ratio"] for r in rows),
        "auroc": statistics.fmean(r["auroc"] for r in rows),
    }


def figure(path: Path, row: dict) -> None:
    """The overlay of one subject: anatomy, map, and the atrophy mask's outline, through the map's peak."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    volume, heatmap, mask = row["volume"], row["heatmap"] / max(float(row["heatmap"].max()), 1e-12), row["mask"]
    peak = np.unravel_index(int(np.argmax(heatmap)), heatmap.shape)
    lo, hi = np.percentile(volume, [1, 99])
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    for axis, ax, name in zip(range(3), axes, ("sagittal", "coronal", "axial")):
        ax.imshow(np.rot90(np.take(volume, peak[axis], axis=axis)), cmap="gray", vmin=lo, vmax=hi)
        shown = ax.imshow(np.rot90(np.take(heatmap, peak[axis], axis=axis)), cmap="inferno", alpha=0.45, vmin=0, vmax=1)
        ax.contour(np.rot90(np.take(mask, peak[axis], axis=axis)).astype(float), levels=[0.5], colors="cyan", linewidths=0.8)
        ax.set_title(name)
        ax.axis("off")
    name = {"hirescam": "HiResCAM", "gradcam": "Grad-CAM"}[row["method"]]
    fig.colorbar(shown, ax=axes, shrink=0.8, label=f"{name} of AD (0-1)")
    fig.suptitle(f"{row['participant']} {row['session']}: {name} at {row['layer']} (cyan: atrophy mask); "
                 f"energy ratio {row['energy_ratio']:.1f}, AUROC {row['auroc']:.2f}")
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, nargs="*", default=None, help="trained run folders (default: train one)")
    parser.add_argument("--cohort", type=Path, default=Path("data/adni_like"), help="for the run trained here")
    parser.add_argument("--limit", type=int, default=None, help="at most this many AD test subjects per run")
    parser.add_argument("--figure", type=Path, default=None, help="PNG of the subject with the median energy ratio")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()

    runs = args.runs
    if not runs:
        from adni_recipe import CONTENDERS, RECIPE, cohort_overrides, ensure_cohort, train

        ensure_cohort(args.cohort, 300, seed=0)
        run = args.out / "gradcam_run"
        train("single", [*cohort_overrides(args.cohort.resolve()), *RECIPE, "trainer.max_epochs=15", *CONTENDERS["single"]],
              run.resolve())
        runs = [run]
    rows, results, bacc = [], {}, {}
    for run in runs:
        scored = score_run(run, args.limit)
        bacc[run.name] = json.loads((run / "metrics.json").read_text()).get("test/bacc", float("nan"))
        for method in METHODS:
            results[(run.name, method)] = summary([r for r in scored if r["method"] == method])
            print(f"{run.name} {method}: {results[(run.name, method)]}", file=sys.stderr, flush=True)
        rows += scored
    for method in METHODS:
        results[("pooled", method)] = summary([r for r in rows if r["method"] == method])
    bacc["pooled"] = statistics.fmean(bacc.values())
    lines = ["| run | test balanced accuracy | method | AD test subjects | pointing game | energy ratio (median; mean) | AUROC |",
             "|---|---|---|---|---|---|---|"]
    for (name, method), r in results.items():
        lines.append(f"| {name} | {bacc[name]:.3f} | {method} | {r['subjects']} | {r['pointing']:.2f} | "
                     f"{r['energy_ratio_median']:.2f}; {r['energy_ratio_mean']:.2f} | {r['auroc']:.3f} |")
    text = "\n".join(lines)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gradcam_localisation.md").write_text(text + "\n")
    keep = ("run", "method", "participant", "session", "layer", "p_disease", "pointing", "energy_ratio", "auroc")
    (args.out / "gradcam_localisation.json").write_text(json.dumps(
        {"results": {f"{run} {method}": r for (run, method), r in results.items()}, "test_bacc": bacc,
         "subjects": [{k: r[k] for k in keep} for r in rows]}, indent=2))
    if args.figure:  # the default method's subject with the median energy ratio, and the same subject by Grad-CAM
        ordered = sorted((r for r in rows if r["method"] == METHODS[0]), key=lambda r: r["energy_ratio"])
        median = ordered[len(ordered) // 2]
        figure(args.figure, median)
        other = next(r for r in rows if r["method"] == METHODS[1] and (r["run"], r["image"]) == (median["run"], median["image"]))
        figure(args.figure.with_name(f"{args.figure.stem}_{METHODS[1]}{args.figure.suffix}"), other)
    print(text)


if __name__ == "__main__":
    main()
