"""3D class activation maps (Grad-CAM, HiResCAM): which parts of a volume drove a class score.

    lightning-hybrid explain --run outputs/runs/<run> --image scan.nii.gz --class AD --out explain/

reads the run's composed config (``.hydra/config.yaml``) and checkpoint, preprocesses the volume
as the run's datamodule does for evaluation, and writes the preprocessed volume and the raw Grad-CAM
map as NIfTI files with the same affine (so any viewer overlays them on each other and on the
original scan), plus a PNG of three orthogonal slices through the map's maximum, the map in colour over the
anatomy with a colour bar (matplotlib, the ``plots`` extra).

The map is a class activation map as computed (1, after scaling by the maximum, is where the class
score depends most on the volume), taken at the last block whose cells are at most 8 mm
(:func:`default_layer`): coarser maps, and maps after self-attention has mixed all positions, cannot
say where. Its channels are weighted by the score's gradient voxel by voxel (HiResCAM, the default)
or by their mean gradient (Grad-CAM, ``--method gradcam``): at such fine layers only the first points
at the cause (:func:`grad_cam_map`). The raw map is kept (the NIfTI file) for scoring it against a
region known to cause the class (``benchmarks/gradcam_localisation.py``).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

log = logging.getLogger(__name__)


#: The default layer's cells are at most this many input voxels along each axis: 6 mm at ADNI's
#: default 1.5 mm voxels, 8 mm at the benchmark's 2 mm (``explain`` picks by the run's spacing, <= 8 mm).
MAX_STRIDE = 4
#: The coarsest cell ``lightning-hybrid explain`` accepts for its default layer, in mm.
MAX_CELL_MM = 8.0


def default_layer(net: nn.Module, volume: torch.Tensor, max_stride: int = MAX_STRIDE) -> str:
    """The last child block with a convolution whose output cells span at most ``max_stride`` input
    voxels along every axis (later blocks are coarser, and self-attention mixes positions) and whose
    next block keeps its resolution: a strided convolution sends its gradient back on a checkerboard
    (every other position), so a map at the block right before a downsampling shows that grid, not
    the cause (3D-ResAttNet: ``layer1_0``, not ``layer1_1``; on the benchmark one of three trained
    networks pointed at the atrophy in 40 % of AD subjects from ``layer1_1``, in 100 % from ``layer1_0``).
    The first block if even that one is coarser."""
    sizes: dict[str, tuple[int, ...]] = {}
    hooks = [
        child.register_forward_hook(lambda _m, _i, out, name=name: sizes.__setitem__(name, tuple(out.shape[2:])))
        for name, child in net.named_children()
        if any(isinstance(m, nn.Conv3d) for m in child.modules())
    ]
    try:
        with torch.no_grad():
            net.eval()(volume.float())
    finally:
        for hook in hooks:
            hook.remove()
    if not sizes:
        raise ValueError(f"{type(net).__name__} has no child block with a Conv3d to take Grad-CAM at")
    names = list(sizes)
    fine = [name for name in names if all(n / s <= max_stride for n, s in zip(volume.shape[2:], sizes[name]))]
    before_downsampling = {a for a, b in zip(names, names[1:]) if any(y < x for x, y in zip(sizes[a], sizes[b]))}
    if not fine:
        return names[0]
    return ([name for name in fine if name not in before_downsampling] or fine)[-1]


#: How the layer's gradients weight its activations: ``"hirescam"`` voxel by voxel (HiResCAM, Draelos &
#: Carin 2020), ``"gradcam"`` by each channel's mean gradient (Grad-CAM, Selvaraju et al. 2017).
METHODS = ("hirescam", "gradcam")


def grad_cam_map(net: nn.Module, volume: torch.Tensor, target_class: int, layer: str | None = None,
                 method: str = "hirescam") -> np.ndarray:
    """The raw class activation map of ``target_class`` for ``volume`` (1 x C x D x H x W) at ``layer``
    (default: :func:`default_layer`), upsampled (trilinear) to the input's size, in the score's units:
    ``ReLU(sum over channels of weight x activation)``, the weight being the score's gradient at each
    voxel (``method="hirescam"``) or its mean over the layer (``"gradcam"``).

    The two agree on coarse layers. On the fine layers where a map can say where (cells of at most
    8 mm), Grad-CAM's mean gradient weights every channel's activation everywhere, edges and cortex
    included: on the ADNI-like benchmark its peak lands in the atrophy in 0 of 10 AD subjects, the
    voxel-wise map's in 10 of 10 (``benchmarks/gradcam_localisation.py``).
    """
    if volume.ndim != 5 or volume.shape[0] != 1:
        raise ValueError(f"expected one volume of shape (1, C, D, H, W), got {tuple(volume.shape)}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    layer = layer or default_layer(net, volume)
    modules = dict(net.named_modules())
    if layer not in modules:
        raise ValueError(f"{type(net).__name__} has no layer {layer!r}; its blocks: {[n for n, _ in net.named_children()]}")
    captured: dict[str, torch.Tensor] = {}

    def keep(_module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
        captured["activation"] = output
        output.register_hook(lambda gradient: captured.__setitem__("gradient", gradient))

    net.eval()
    hook = modules[layer].register_forward_hook(keep)
    try:
        with torch.enable_grad():
            logits = net(volume.float().detach().requires_grad_(True))  # gradients reach the layer even if frozen
            logits[:, target_class].sum().backward()
    finally:
        hook.remove()
        net.zero_grad(set_to_none=True)
    activation, gradient = captured["activation"].detach(), captured["gradient"]
    weights = gradient if method == "hirescam" else gradient.mean(dim=tuple(range(2, gradient.ndim)), keepdim=True)
    cam = torch.relu((weights * activation).sum(dim=1, keepdim=True))
    cam = torch.nn.functional.interpolate(cam, size=volume.shape[2:], mode="trilinear", align_corners=False)
    return cam[0, 0].cpu().numpy().astype(np.float32)


def grad_cam(net: nn.Module, volume: torch.Tensor, target_class: int, layer: str | None = None,
             method: str = "hirescam") -> np.ndarray:
    """:func:`grad_cam_map` scaled to [0, 1] by its maximum: 1 where the class score depends most on the
    volume, 0 where not at all (never flipped: MONAI's ``GradCAM`` post-processing maps the minimum to 1)."""
    heatmap = grad_cam_map(net, volume, target_class, layer, method)
    peak = float(heatmap.max())
    return heatmap / peak if peak > 0 else heatmap


def localisation_scores(heatmap: np.ndarray, region: np.ndarray, brain: np.ndarray, tolerance: int = 0) -> dict[str, float]:
    """How well a map points at a region known to cause the class (all three arrays on one grid):

    * ``pointing``: 1 if the map's peak lies in the region dilated by ``tolerance`` voxels, else 0
      (the pointing game);
    * ``energy_ratio``: the map's share of its sum over the brain that falls inside the region,
      over the region's share of the brain's voxels (1: no better than a map spread evenly);
    * ``auroc``: of the map's values inside the brain, region voxels against the rest (0.5: chance).
    """
    from scipy import ndimage
    from sklearn.metrics import roc_auc_score

    region, brain = region.astype(bool), brain.astype(bool)
    if not (region & brain).any() or not (brain & ~region).any():
        raise ValueError("the region must cover part of the brain, and not all of it")
    target = ndimage.binary_dilation(region, iterations=tolerance) if tolerance else region
    peak = np.unravel_index(int(np.argmax(heatmap)), heatmap.shape)
    inside = region & brain
    total = float(heatmap[brain].sum())
    energy_share = float(heatmap[inside].sum()) / total if total > 0 else float("nan")
    return {
        "pointing": float(target[peak]),
        "energy_ratio": energy_share / (inside.sum() / brain.sum()),
        "auroc": float(roc_auc_score(region[brain], heatmap[brain])) if total > 0 else float("nan"),
    }


def slices_through_peak(volume: np.ndarray, heatmap: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Three orthogonal slices through the heatmap's maximum (sagittal, coronal, axial for a RAS
    volume), each ``(anatomy, heatmap)``, rotated for display."""
    center = np.unravel_index(int(np.argmax(heatmap)), heatmap.shape)
    return [(np.rot90(np.take(volume, center[axis], axis=axis)), np.rot90(np.take(heatmap, center[axis], axis=axis)))
            for axis in range(3)]


def save_overlay(path: Path, volume: np.ndarray, heatmap: np.ndarray, title: str) -> None:
    """A PNG of :func:`slices_through_peak`: the anatomy in grey (1st-99th percentile), the map over it
    in colour, and a colour bar of the map's values (matplotlib: ``pip install "lightning-hybrid[plots]"``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lo, hi = np.percentile(volume, [1, 99])
    figure = Figure(figsize=(10, 3.6), layout="constrained")
    FigureCanvasAgg(figure)  # files only, without pyplot: no display, the caller's backend untouched
    axes = figure.subplots(1, 3)
    for ax, (anatomy, cam), name in zip(axes, slices_through_peak(volume, heatmap), ("sagittal", "coronal", "axial")):
        ax.imshow(anatomy, cmap="gray", vmin=lo, vmax=hi, interpolation="nearest")
        shown = ax.imshow(cam, cmap="inferno", alpha=0.45, vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(name)
        ax.axis("off")
    figure.colorbar(shown, ax=axes, shrink=0.8, label="Grad-CAM (0-1)")
    figure.suptitle(title)
    figure.savefig(path, dpi=100)


def run_config(run_dir: Path) -> Any:
    """A run's composed config, its paths resolvable outside Hydra (the run's working directory and folder)."""
    from omegaconf import OmegaConf, open_dict

    from lightning_hybrid.data.adni_settings import FLAT_NAMES, group_flat_arguments

    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    hydra_file = run_dir / ".hydra" / "hydra.yaml"
    cwd = OmegaConf.select(OmegaConf.load(hydra_file), "hydra.runtime.cwd") if hydra_file.is_file() else None
    with open_dict(cfg):
        if "paths" in cfg:
            cfg.paths.root_dir = cwd or str(Path.cwd())
            cfg.paths.output_dir = str(run_dir)
        flat = [name for name in FLAT_NAMES if name in cfg.data and not OmegaConf.is_dict(cfg.data[name])]
        if flat and str(cfg.data.get("_target_", "")).endswith("ADNIDataModule"):  # a run from before the grouping
            cfg.data = OmegaConf.create(group_flat_arguments(OmegaConf.to_container(cfg.data)))
        if OmegaConf.select(cfg, "data.cache.dir") is not None:  # only the preprocessing is used here
            cfg.data.cache.where, cfg.data.cache.dir = None, None
    return cfg


def class_index(datamodule: Any, target: str | int | None) -> int:
    """A class given by name (``AD``) or index; ``None``: the disease class (``datamodule.positive_class``, else 1)."""
    labels = list(getattr(datamodule, "labels", []))
    if target is None:
        return int(getattr(datamodule, "positive_class", 1))
    if isinstance(target, str) and not target.isdigit():
        if target not in labels:
            raise ValueError(f"class {target!r} is not one of the run's classes {labels}")
        return labels.index(target)
    return int(target)


def explain_run(run_dir: Path, image: Path, target_class: str | int | None, out: Path, checkpoint: Path | None,
                layer: str | None, method: str = "hirescam") -> dict:
    """Grad-CAM of a trained run for one volume; returns the written files. The default layer is the
    last whose cells are at most :data:`MAX_CELL_MM` at the run's voxel spacing."""
    import nibabel as nib
    from hydra.utils import instantiate

    cfg = run_config(run_dir)
    net = instantiate(cfg.model, _convert_="all")
    ckpt = checkpoint or run_dir / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    net.load_state_dict({k[len("net."):]: v for k, v in state.items() if k.startswith("net.")})
    datamodule = instantiate(cfg.data, _convert_="all")
    if not hasattr(datamodule, "preprocessing"):
        raise ValueError(f"the run's data ({cfg.data._target_}) is not a volume datamodule; explain needs ADNI-style data")
    target = class_index(datamodule, target_class)
    preprocessed = datamodule.preprocessing(keep_meta=True)({"image": str(image)})["image"]
    volume = torch.as_tensor(preprocessed)[None]
    layer = layer or default_layer(net, volume, max_stride=max(1, int(MAX_CELL_MM // datamodule.view.voxel_mm)))
    heatmap = grad_cam_map(net, volume, target, layer, method)
    affine = np.asarray(preprocessed.affine, dtype=np.float64)
    out.mkdir(parents=True, exist_ok=True)
    stem = image.name.split(".")[0]
    name = (datamodule.labels[target] if target < len(getattr(datamodule, "labels", [])) else f"class{target}")
    files = {
        "volume": out / f"{stem}_preprocessed.nii.gz",
        "gradcam": out / f"{stem}_{method}_{name}.nii.gz",
        "png": out / f"{stem}_{method}_{name}.png",
    }
    nib.save(nib.Nifti1Image(volume[0, 0].numpy().astype(np.float32), affine), files["volume"])
    nib.save(nib.Nifti1Image(heatmap, affine), files["gradcam"])  # raw: the score's units, for scoring
    peak = float(heatmap.max())
    try:
        save_overlay(files["png"], volume[0, 0].numpy(), heatmap / peak if peak > 0 else heatmap,
                     f"{stem}: {'HiResCAM' if method == 'hirescam' else 'Grad-CAM'} of {name} at {layer}")
    except ImportError:
        log.warning('no PNG: matplotlib is not installed (pip install "lightning-hybrid[plots]"); the NIfTI files are written')
        del files["png"]
    return files


def explain_command(argv: list[str]) -> None:
    """``lightning-hybrid explain --run RUN --image VOL [--class AD] [--out DIR]``."""
    parser = argparse.ArgumentParser(prog="lightning-hybrid explain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a run folder of lightning-hybrid (with .hydra/)")
    parser.add_argument("--image", type=Path, required=True, help="a NIfTI volume or ClinicaDL .pt tensor")
    parser.add_argument("--class", dest="target_class", default=None,
                        help="class to explain, by name (AD) or index (default: the disease class)")
    parser.add_argument("--out", type=Path, default=Path("explain"))
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: RUN/checkpoints/last.ckpt")
    parser.add_argument("--layer", default=None, help=f"block to take the map at (default: the last with cells of at "
                        f"most {MAX_CELL_MM:g} mm)")
    parser.add_argument("--method", choices=METHODS, default="hirescam",
                        help="hirescam: gradients weight activations voxel by voxel (default); gradcam: by channel means")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    files = explain_run(args.run, args.image, args.target_class, args.out, args.checkpoint, args.layer, args.method)
    for kind, path in files.items():
        log.info("%s: %s", kind, path)
