"""``lightning-hybrid plan``: every placement method's stages and predicted bottleneck, side by side.

    lightning-hybrid plan model=resattnet3d_18 devices=[1,2] input=[1,64,76,64] batch=6
    lightning-hybrid plan model=lenet5 devices=[1,1,2] measure_time=true

``model=`` and ``model.*`` are the training config's model options; ``devices`` a list of speeds or
of ``{speed, memory, bandwidth}`` mappings (one per stage; YAML syntax); ``input`` one sample's shape
(default ``[1,28,28]``, MNIST); ``batch`` the (micro-)batch the blocks are profiled with;
``stages`` fewer stages than devices; ``methods`` a subset; ``seed``; ``objective``;
``measure_time`` to time each block on this machine (the ``time`` method uses it); ``speeds_in``
``flops`` (default: device speeds are relative, block costs are scaled so that speed 1 is this
machine's probed FLOP/s) or ``raw`` (speeds are FLOP/s).
"""

from __future__ import annotations

import torch
import yaml
from hydra import compose, initialize_config_module

from lightning_hybrid.cli.app import build
from lightning_hybrid.placement.cost import profile_blocks
from lightning_hybrid.placement.devices import devices_from_config, probe_speed
from lightning_hybrid.placement.plan import METHODS, compare, format_comparison

OPTIONS = {"devices": "[1,2]", "input": "[1,28,28]", "batch": "4", "stages": "null", "methods": None, "seed": "0",
           "objective": "bottleneck", "measure_time": "false", "speeds_in": "flops"}


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
    with initialize_config_module(config_module="lightning_hybrid.configs", version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    net = build(cfg.model)
    example = torch.randn(int(parsed["batch"]), *[int(s) for s in parsed["input"]])
    blocks = profile_blocks(net, example, measure_time=bool(parsed["measure_time"]))
    devices = devices_from_config(parsed["devices"])
    if parsed["speeds_in"] == "flops":
        base = probe_speed()
        devices = [type(d)(d.name, d.speed * base, d.memory, d.bandwidth) for d in devices]
    methods = parsed["methods"] or list(METHODS)
    results = compare(blocks, devices, methods=methods, stages=parsed["stages"], seed=int(parsed["seed"]),
                      objective=parsed["objective"])
    table = format_comparison(blocks, devices, results)
    header = (f"{type(net).__name__}: {len(blocks)} blocks, {sum(b.cost for b in blocks) / 1e9:.3f} GFLOP per step "
              f"(forward + backward, batch {parsed['batch']}), devices "
              + ", ".join(f"{d.name} {d.speed / 1e9:.2f} GFLOP/s" for d in devices))
    text = header + "\n\n" + table
    print(text)
    return text
