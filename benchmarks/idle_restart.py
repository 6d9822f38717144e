"""TCP's slow start after idle on a long link: each contender's step through the delay line with Linux's default
(``net.ipv4.tcp_slow_start_after_idle=1``: RFC 2861's checks shrink the congestion window of a connection idle,
or not filling its window, for a retransmission timeout) and without it (``0``), side by side, alternated (the
default first in each pair), ``--repeats`` times; beside the simulator's step fitted to the same line, where
``benchmarks/results/long_link.json`` holds it (``benchmarks/long_link.py --phase steps``).

    python benchmarks/idle_restart.py --data-root ../shared/data/mnist    # as root (network namespaces, TUN)

Writes benchmarks/results/idle_restart.json (every run) and idle_restart.md (the table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from long_link import settings, step_s, through_line  # noqa: E402

from lightning_hybrid.sim.link import DelayedLink, why_not_delayed  # noqa: E402


def fitted_simulator_s(results: Path, name: str, rtt_ms: float) -> float | None:
    """The simulator's step fitted to the line (its round trip and measured rate), median over long_link's runs."""
    if not results.is_file():
        return None
    steps = [s["fitted_sim_s"] for s in json.loads(results.read_text()).get("steps", [])
             if s["name"] == name and s["rtt_ms"] == rtt_ms and "fitted_sim_s" in s]
    return statistics.median(steps) if steps else None


def table(runs: list[dict], long_link: Path) -> str:
    lines = ["| round trip | contender | step, restart after idle (Linux's default) ms | step, no restart ms | "
             "default over none | simulator fitted to the line ms | simulator over no restart |",
             "|---|---|---|---|---|---|---|"]
    for rtt, name in sorted({(r["rtt_ms"], r["name"]) for r in runs}):
        on = [1000 * r["step_s"] for r in runs if (r["rtt_ms"], r["name"], r["restart"]) == (rtt, name, True)]
        off = [1000 * r["step_s"] for r in runs if (r["rtt_ms"], r["name"], r["restart"]) == (rtt, name, False)]
        if not on or not off:
            continue
        sim = fitted_simulator_s(long_link, name, rtt)
        sim_cells = f"{1000 * sim:.1f} | {1000 * sim / statistics.median(off):.2f}x" if sim else "- | -"
        lines.append(f"| {rtt:g} ms | {name} | {statistics.median(on):.1f} ({', '.join(f'{v:.1f}' for v in on)}) | "
                     f"{statistics.median(off):.1f} ({', '.join(f'{v:.1f}' for v in off)}) | "
                     f"{statistics.median(on) / statistics.median(off):.2f}x | {sim_cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default=None, help="MNIST folder (without it: synthetic data)")
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[50.0])
    parser.add_argument("--contenders", nargs="+", default=["ddp", "dga_d2", "dga_d4"])
    parser.add_argument("--lr", type=float, default=0.02, help="the step's time does not depend on it")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args(argv)
    why = why_not_delayed()
    if why is not None:
        raise SystemExit(f"no delay line here: {why}")
    batches = ["trainer.max_epochs=1", f"trainer.limit_train_batches={args.batches}", "trainer.limit_val_batches=0",
               "test=false", "callbacks=[epoch_timer]"]
    runs = []
    for repeat in range(args.repeats):  # the two settings alternated: a drift meets both
        for rtt in args.rtt_ms:
            for name in args.contenders:
                for restart in (True, False):
                    with DelayedLink(rtt / 2000, slow_start_after_idle=restart) as link:
                        line = through_line([*settings(args, name, args.lr), *batches],
                                            args.out / "idle_restart_runs" / f"{name}_{rtt:g}_{int(restart)}_{repeat}",
                                            link, args.timeout_s)
                    runs.append({"rtt_ms": rtt, "name": name, "restart": restart, "repeat": repeat,
                                 "step_s": step_s(line["rows"], args.batches), "line": link.stats})
                    print(f"[{name} {rtt:g} ms, restart after idle {'on' if restart else 'off'} #{repeat}] "
                          f"{1000 * runs[-1]['step_s']:.1f} ms a step", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "idle_restart.json").write_text(json.dumps(runs, indent=1))
    text = table(runs, args.out / "long_link.json")
    (args.out / "idle_restart.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
