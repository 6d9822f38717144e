"""3D Grad-CAM: the map's shape and content, the PNG, and `lightning-hybrid explain` end to end."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
import torch

from torch import nn

from conftest import Zygote, clean_env, run_cli
from lightning_hybrid.explain import default_layer, grad_cam, grad_cam_map, save_overlay, slices_through_peak
from lightning_hybrid.models import ResAttNet3D


def test_grad_cam_map_has_the_input_shape_and_is_not_constant():
    torch.manual_seed(0)
    net = ResAttNet3D(depth=18, base_channels=4)
    volume = torch.randn(1, 1, 32, 40, 32)
    # stage 1 (1/4: cells of 4 voxels, 6 mm at 1.5 mm) is the last whose cells span at most 4 voxels, and of
    # its blocks the last not followed by a downsampling (whose gradient comes back on a checkerboard)
    assert default_layer(net, volume) == "layer1_0"
    assert default_layer(net, volume, max_stride=8) == "layer2_0"
    assert default_layer(net, volume, max_stride=1) == "stem"  # nothing that fine: the first block
    heatmap = grad_cam(net, volume, target_class=1)
    assert heatmap.shape == (32, 40, 32) and heatmap.dtype == np.float32
    assert heatmap.std() > 0.01 and 0.0 <= heatmap.min() and heatmap.max() == 1.0


class _BoxScore(nn.Module):
    """Class 1's score: the mean feature inside one box; class 0's: 0. Nothing outside the box matters."""

    def __init__(self, box: tuple[slice, ...]) -> None:
        super().__init__()
        self.box = box

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        inside = features[(slice(None), slice(None), *self.box)].mean(dim=(1, 2, 3, 4))
        return torch.stack([torch.zeros_like(inside), inside], dim=1)


@pytest.mark.parametrize("method", ["hirescam", "gradcam"])
def test_the_maps_maximum_lies_in_the_only_region_the_class_score_depends_on(method):
    """MONAI's default post-processing maps (min, max) to (1, 0): its peak was the least important voxel."""
    torch.manual_seed(0)
    box = (slice(4, 14), slice(6, 18), slice(8, 20))
    features = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.ReLU())
    nn.init.constant_(features[0].weight, 1.0 / 27)
    nn.init.zeros_(features[0].bias)
    net = nn.Sequential()
    net.add_module("features", features)
    net.add_module("head", _BoxScore(box))
    volume = torch.rand(1, 1, 24, 24, 28) * 0.2
    volume[0, 0, 7:10, 10:13, 12:15] += 1.0  # one bright blob, inside the box
    heatmap = grad_cam(net, volume, target_class=1, method=method)
    peak = np.unravel_index(int(np.argmax(heatmap)), heatmap.shape)
    assert all(s.start <= p < s.stop for p, s in zip(peak, box)), f"peak {peak} outside the box {box}"
    assert heatmap[7:10, 10:13, 12:15].mean() > 3 * heatmap.mean()  # the blob stands out, not the background
    raw = grad_cam_map(net, volume, target_class=1, method=method)
    assert np.allclose(raw / raw.max(), heatmap) and raw.min() >= 0
    outside = np.ones(heatmap.shape, bool)
    outside[box] = False
    if method == "hirescam":  # voxel-wise gradients: nothing outside the region the score reads
        assert heatmap[outside].max() == 0.0
    else:  # the mean gradient weights activations everywhere: the background gets a share
        assert heatmap[outside].max() > 0.0


def test_the_slices_go_through_the_maps_peak_and_the_png_shows_the_map_in_colour(tmp_path):
    pytest.importorskip("matplotlib", reason="the PNG needs matplotlib (the plots extra)")
    import matplotlib.image

    volume = np.random.rand(20, 24, 18).astype(np.float32)
    heatmap = np.zeros_like(volume)
    heatmap[5, 7, 9] = 1.0
    slices = slices_through_peak(volume, heatmap)
    assert [cam.max() for _, cam in slices] == [1.0, 1.0, 1.0]  # every slice holds the peak
    assert [a.shape for a, _ in slices] == [(18, 24), (18, 20), (24, 20)]  # np.rot90 of the slices
    path = tmp_path / "x.png"
    save_overlay(path, volume, heatmap, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)[..., :3]
    assert image.shape[0] > 200 and image.shape[1] > 500
    colourful = np.abs(image[..., 0] - image[..., 2]) > 0.3  # the colour map's hues, not the grey anatomy
    assert colourful.mean() > 0.001, "no coloured pixel: the map (or its colour bar) is missing"


def test_explain_command_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    run_cli(
        "data=adni_phantoms", f"data.root={tmp_path / 'synth'}", "data.subjects=24", "data.volume_shape=[32,36,32]",
        "data.view.image_shape=[32,32,32]", "data.batch_size=2", "model=resattnet3d_18", "model.base_channels=4",
        "trainer=debug", f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )
    image = next((tmp_path / "synth" / "images").iterdir())
    proc = Zygote.run(
        ["-m", "lightning_hybrid.cli", "explain", "--run", str(run_dir), "--image", str(image),
         "--out", str(tmp_path / "explain")], clean_env(), tmp_path, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stem = image.name.split(".")[0]
    cam = nib.load(tmp_path / "explain" / f"{stem}_hirescam_AD.nii.gz")  # the disease class by default
    volume = nib.load(tmp_path / "explain" / f"{stem}_preprocessed.nii.gz")
    assert cam.shape == volume.shape == (32, 32, 32)
    assert np.allclose(cam.affine, volume.affine)  # aligned: same grid, same world coordinates
    assert nib.aff2axcodes(cam.affine) == ("R", "A", "S")
    assert (tmp_path / "explain" / f"{stem}_hirescam_AD.png").read_bytes()[:4] == b"\x89PNG"
