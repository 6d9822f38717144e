"""The placement figure: drawn without Lightning (lightning_hybrid.placement.figure), and logged by
HybridParallelStrategy to a TensorBoard logger (a real 2-stage fit on CPU processes), as an image
and as text; text only without matplotlib; nothing without a TensorBoard logger."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

from lightning_hybrid import HybridParallelStrategy
from lightning_hybrid.pipeline import Mesh
from lightning_hybrid.placement import Block, Device, plan
from lightning_hybrid.placement.figure import format_placement, placement_figure

from conftest import SUPPORT, run_script

SCRIPT = SUPPORT / "hybrid_script.py"
BLOCKS = [Block(f"b{i}", cost=c, memory=2**20) for i, c in enumerate([4, 1, 1, 2, 2, 2])]
DEVICES = [Device("slow", speed=1.0), Device("fast", speed=2.0)]


def events(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"images": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def logged_text(accumulator) -> str:
    return accumulator.Tensors("placement/text_summary")[0].tensor_proto.string_val[0].decode()


# ---------------------------------------------------------------------- the drawing, without Lightning
def test_placement_figure_draws_one_placement_with_its_stages_and_timeline():
    pytest.importorskip("matplotlib", reason="the figure needs matplotlib (the plots extra)")
    placement = plan(BLOCKS, DEVICES, method="exact")  # fast: b0..b3, slow: b4..b5, both 4 s
    figure = placement_figure(placement, DEVICES, [b.name for b in BLOCKS], ranks=[[1, 3], [0, 2]],
                              micro_batches=4, schedule="1F1B", steps=2)
    stages, pipeline = figure.axes
    labels = [t.get_text() for t in stages.texts]
    assert labels[0].splitlines() == ["stage 0: fast", "ranks 1,3", "b0..b3 (4 blocks)", "4 s (bottleneck)"]
    assert labels[1].splitlines()[:3] == ["stage 1: slow", "ranks 0,2", "b4..b5 (2 blocks)"]
    bars = stages.patches
    assert [b.get_width() for b in bars] == [4.0, 4.0]
    assert all(b.get_linewidth() == 2.5 for b in bars)  # a tie: both stages are the bottleneck
    assert [t.get_text() for t in pipeline.get_yticklabels()] == ["stage 0: fast, ranks 1,3", "stage 1: slow, ranks 0,2"]
    assert len(pipeline.patches) == 2 * 2 * 2 * 4  # stages x steps x (forward, backward) x micro-batches
    # per step 4 s on each stage: 2 steps of 1F1B on 2 equal stages end at (4 + 1) x 1 s ... x 2
    assert max(b.get_x() + b.get_width() for b in pipeline.patches) == pytest.approx(2 * (4 + 2 - 1))
    figure.canvas.draw()
    width, height = figure.canvas.get_width_height()
    assert width > 800 and height > 150


def test_per_micro_batch_times_run_micro_batches_of_them_per_step():
    pytest.importorskip("matplotlib", reason="the figure needs matplotlib (the plots extra)")
    placement = plan(BLOCKS, DEVICES, method="exact")
    figure = placement_figure(placement, DEVICES, micro_batches=4, steps=1, time_unit="micro-batch")
    pipeline = figure.axes[1]
    # a micro-batch's forward and backward take the stage's 4 s: (4 + 2 - 1) micro-batch slots
    assert max(b.get_x() + b.get_width() for b in pipeline.patches) == pytest.approx(4 * (4 + 2 - 1))
    assert "blocks 0..3 (4 blocks)" in figure.axes[0].texts[0].get_text()
    with pytest.raises(ValueError, match="time_unit"):
        placement_figure(placement, DEVICES, time_unit="epoch")
    with pytest.raises(ValueError, match="uses device 1 but 1 devices"):
        placement_figure(placement, DEVICES[:1])


def test_format_placement_names_each_stage_device_ranks_blocks_and_time():
    placement = plan(BLOCKS, [Device("slow", speed=1.0), Device("fast", speed=4.0)], method="exact")
    devices = [Device("slow", speed=1.0), Device("fast", speed=4.0)]
    text = format_placement(placement, devices, [b.name for b in BLOCKS], ranks=[[st.device] for st in placement.stages])
    lines = text.splitlines()
    assert "exact" in lines[0] and f"bottleneck {placement.bottleneck:.4g} s per step" in lines[0]
    rows = [line for line in lines if line.startswith("| 0 ") or line.startswith("| 1 ")]
    for s, (row, stage) in enumerate(zip(rows, placement.stages)):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[:3] == [str(s), devices[stage.device].name, str(stage.device)]
        span = f"b{stage.start}" if stage.stop - stage.start == 1 else f"b{stage.start}..b{stage.stop - 1}"
        assert cells[3] == f"{span} ({stage.stop - stage.start} block{'s' if stage.stop - stage.start > 1 else ''})"
        assert float(cells[6]) == pytest.approx(stage.time_s, rel=1e-3)
        assert float(cells[8]) == devices[stage.device].speed
        assert cells[9] == ("bottleneck" if stage.time_s == placement.bottleneck else "")


# ---------------------------------------------------------------------- the strategy's logging, in-process
def planned_strategy(loggers) -> HybridParallelStrategy:
    """A strategy with a placement and a mesh, and a module attached to a Trainer with ``loggers``."""
    strategy = HybridParallelStrategy(pipeline_stages=2, data_parallel=1, devices=[1.0, 2.0])
    strategy.placement = plan(BLOCKS, DEVICES, method="exact")
    strategy.mesh = Mesh(2, 1, tuple(strategy.placement.device_order))
    strategy._lightning_module = SimpleNamespace(_trainer=None if loggers is None else SimpleNamespace(loggers=loggers))
    return strategy


def test_without_a_tensorboard_logger_nothing_is_logged(tmp_path):
    csv = CSVLogger(tmp_path / "csv")
    for loggers in (None, [], [csv]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            planned_strategy(loggers)._log_placement(DEVICES, [b.name for b in BLOCKS])
    assert not (tmp_path / "csv").exists()  # the CSV logger's experiment was never touched


def test_without_matplotlib_the_placement_is_logged_as_text_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    logger = TensorBoardLogger(tmp_path, name="tb", version=0)
    with pytest.warns(UserWarning, match=r'pip install "lightning-hybrid\[plots\]"') as caught:
        planned_strategy([logger])._log_placement(DEVICES, [b.name for b in BLOCKS])
    assert len([w for w in caught if "plots" in str(w.message)]) == 1
    logger.experiment.flush()
    accumulator = events(tmp_path / "tb" / "version_0")
    assert "placement" not in accumulator.Tags()["images"]
    text = logged_text(accumulator)
    assert "| 0 | fast | 1 | b0..b3 (4 blocks) |" in text and "| 1 | slow | 0 | b4..b5 (2 blocks) |" in text


# ---------------------------------------------------------------------- a real fit
@pytest.mark.multiprocess
def test_a_hybrid_fit_logs_its_placement_figure_and_text_to_tensorboard(tmp_path):
    pytest.importorskip("matplotlib", reason="the figure needs matplotlib (the plots extra)")
    import torch

    run_script(SCRIPT, tmp_path, "--stages", "2", "--samples", "16", "--batch", "16", "--speeds", "1,2", "--tensorboard")
    accumulator = events(tmp_path / "tb" / "version_0")
    images = accumulator.Images("placement")
    assert len(images) == 1 and images[0].step == 0
    assert images[0].width > 800 and images[0].height > 150
    text = logged_text(accumulator)
    placement = torch.load(tmp_path / "result.pt")["placement"]
    assert f"**{placement['method']}** placement" in text
    for s, stage in enumerate(placement["stages"]):
        # device d is pipeline position d, run by rank d of the one replica
        assert f"| {s} | device{stage['device']} | {stage['device']} |" in text, text
