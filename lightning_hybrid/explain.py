"""3D Grad-CAM explanations: which parts of a volume drove a class score.

    lightning-hybrid explain --run outputs/runs/<run> --image scan.nii.gz --class 1 --out explain/

reads the run's composed config (``.hydra/config.yaml``) and checkpoint, preprocesses the volume
as the run's datamodule does for evaluation, and writes the preprocessed volume and the Grad-CAM
map as NIfTI files with the same affine (so any viewer overlays them on each other and on the
original scan), plus a PNG of three orthogonal slices through the map's maximum, the map in colour over the
anatomy with a colour bar (matplotlib, the ``plots`` extra).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import torch
from torch import nn

log = logging.getLogger(__name__)


def default_layer(net: nn.Module, volume: torch.Tensor, min_size: int = 4) -> str:
    """The last child block with a convolution whose output is still at least ``min_size`` voxels
    along every axis (a map of one voxel says nothing about where); the first such block otherwise."""
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
    fine = [name for name, size in sizes.items() if min(size) >= min_size]
    return fine[-1] if fine else next(iter(sizes))


def grad_cam(net: nn.Module, volume: torch.Tensor, target_class: int, layer: str | None = None) -> np.ndarray:
    """Grad-CAM map of ``target_class`` for ``volume`` (1 x C x D x H x W), at the input's size, in [0, 1]."""
    from monai.visualize import GradCAM

    if volume.ndim != 5 or volume.shape[0] != 1:
        raise ValueError(f"expected one volume of shape (1, C, D, H, W), got {tuple(volume.shape)}")
    net.eval()
    cam = GradCAM(nn_module=net, target_layers=layer or default_layer(net, volume))
    with torch.enable_grad():
        heatmap = cam(volume.float(), class_idx=target_class)
    return heatmap[0, 0].detach().cpu().numpy().astype(np.float32)


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


def explain_run(run_dir: Path, image: Path, target_class: int, out: Path, checkpoint: Path | None, layer: str | None) -> dict:
    """Grad-CAM of a trained run for one volume; returns the written files."""
    import nibabel as nib
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    if "cache_dir" in cfg.data:  # only the preprocessing is used here, and ${hydra:...} paths resolve in a run only
        cfg.data.cache, cfg.data.cache_dir = None, None
    net = instantiate(cfg.model, _convert_="all")
    ckpt = checkpoint or run_dir / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    net.load_state_dict({k[len("net."):]: v for k, v in state.items() if k.startswith("net.")})
    datamodule = instantiate(cfg.data, _convert_="all")
    if not hasattr(datamodule, "preprocessing"):
        raise ValueError(f"the run's data ({cfg.data._target_}) is not a volume datamodule; explain needs ADNI-style data")
    preprocessed = datamodule.preprocessing(keep_meta=True)({"image": str(image)})["image"]
    volume = torch.as_tensor(preprocessed)[None]
    heatmap = grad_cam(net, volume, target_class, layer)
    affine = np.asarray(preprocessed.affine, dtype=np.float64)
    out.mkdir(parents=True, exist_ok=True)
    stem = image.name.split(".")[0]
    files = {
        "volume": out / f"{stem}_preprocessed.nii.gz",
        "gradcam": out / f"{stem}_gradcam_class{target_class}.nii.gz",
        "png": out / f"{stem}_gradcam_class{target_class}.png",
    }
    nib.save(nib.Nifti1Image(volume[0, 0].numpy().astype(np.float32), affine), files["volume"])
    nib.save(nib.Nifti1Image(heatmap, affine), files["gradcam"])
    try:
        save_overlay(files["png"], volume[0, 0].numpy(), heatmap, f"{stem}: Grad-CAM of class {target_class} at {layer or 'the last conv block'}")
    except ImportError:
        log.warning('no PNG: matplotlib is not installed (pip install "lightning-hybrid[plots]"); the NIfTI files are written')
        del files["png"]
    return files


def explain_command(argv: list[str]) -> None:
    """``lightning-hybrid explain --run RUN --image VOL [--class C] [--out DIR]``."""
    parser = argparse.ArgumentParser(prog="lightning-hybrid explain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a run folder of lightning-hybrid (with .hydra/)")
    parser.add_argument("--image", type=Path, required=True, help="a NIfTI volume")
    parser.add_argument("--class", dest="target_class", type=int, default=1, help="class to explain (AD = 1)")
    parser.add_argument("--out", type=Path, default=Path("explain"))
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: RUN/checkpoints/last.ckpt")
    parser.add_argument("--layer", default=None, help="block to take Grad-CAM at (default: the last conv block)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    files = explain_run(args.run, args.image, args.target_class, args.out, args.checkpoint, args.layer)
    for kind, path in files.items():
        log.info("%s: %s", kind, path)
