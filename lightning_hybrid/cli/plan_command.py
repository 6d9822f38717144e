"""``lightning-hybrid plan``: every placement method's stages and predicted bottleneck, side by side.

    lightning-hybrid plan model=resattnet3d_18 devices=[1,2] input=[1,64,76,64] batch=6
    lightning-hybrid plan model=lenet5 devices=[1,1,2] measure_time=true

``model=`` and ``model.*`` are the training config's model options; ``devices`` a list of speeds or
of ``{speed, memory, bandwidth}`` mappings (one per stage; YAML syntax); ``input`` one sample's shape
(default ``[1,28,28]``, MNIST); ``batch`` the (micro-)batch the blocks are profiled with;
``stages`` fewer stages than devices; ``methods`` a subset; ``seed``; ``objective``;
``measure_time`` to time each block on this machine (the ``time`` method uses it); ``speeds_in``
says what the device speeds are (:mod:`lightning_hybrid.devices`): ``flops`` (default) relative
speeds, turned into FLOP/s with this machine's probed FLOP/s as speed 1, or ``raw`` FLOP/s;
``figure=PATH`` also draws the placements and the best one's pipeline timeline into a PNG
(:mod:`lightning_hybrid.cli.plan_figure`; matplotlib, the ``plots`` extra).
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml
from hydra import compose, initialize_config_module

from lightning_hybrid.cli.app import build
from lightning_hybrid.devices import devices_from_config, devices_in_flops, probe_speed
from lightning_hybrid.placement.cost import profile_blocks
from lightning_hybrid.placement.plan import METHODS, compare, format_comparison

OPTIONS = {"devices": "[1,2]", "input": "[1,28,28]", "batch": "4", "stages": "null", "methods": None, "seed": "0",
           "objective": "bottleneck", "measure_time": "false", "speeds_in": "flops", "figure": None}
SPEEDS_IN = {"flops": "relative", "raw": "flop/s"}
"""``speeds_in`` values and the unit (:data:`lightning_hybrid.devices.SPEED_UNITS`) of the speeds given."""


def plan_command(argv: list[str]) -> str:
    options = dict(OPTIONS)
    overrides = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in options:
            options[key] = value
        elif sep and (key == "model" or key.startswith("model.")):
            overrides.append(arg)
        else:
            raise SystemExit(f"lightning-hybrid plan: unknown argument {arg!r}; use model=..., model.*=..., or "
                             f"{', '.join(OPTIONS)} (key=value)")
    parsed = {k: yaml.safe_load(v) if v is not None else None for k, v in options.items()}
    if parsed["speeds_in"] not in SPEEDS_IN:
        raise SystemExit(f"lightning-hybrid plan: speeds_in must be {' or '.join(SPEEDS_IN)}, got {parsed['speeds_in']!r}")
    with initialize_config_module(config_module="lightning_hybrid.configs", version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    net = build(cfg.model)
    example = torch.randn(int(parsed["batch"]), *[int(s) for s in parsed["input"]])
    blocks = profile_blocks(net, example, measure_time=bool(parsed["measure_time"]))
    unit = SPEEDS_IN[parsed["speeds_in"]]
    devices = devices_in_flops(devices_from_config(parsed["devices"]), unit, probe_speed() if unit == "relative" else None)
    methods = parsed["methods"] or list(METHODS)
    results = compare(blocks, devices, methods=methods, stages=parsed["stages"], seed=int(parsed["seed"]),
                      objective=parsed["objective"])
    table = format_comparison(blocks, devices, results)
    header = (f"{type(net).__name__}: {len(blocks)} blocks, {sum(b.cost for b in blocks) / 1e9:.3f} GFLOP per step "
              f"(forward + backward, batch {parsed['batch']}), devices "
              + ", ".join(f"{d.name} {d.speed / 1e9:.2f} GFLOP/s" for d in devices))
    text = header + "\n\n" + table
    if parsed["figure"]:
        from lightning_hybrid.cli.plan_figure import draw

        draw(Path(str(parsed["figure"])), devices, results, block_names=[b.name for b in blocks])
        text += f"\n\nfigure: {parsed['figure']}"
    print(text)
    return text
