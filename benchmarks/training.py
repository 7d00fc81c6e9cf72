"""What the training benchmarks share: the four plugin configurations, the data-set arguments
and the table of epochs. Each benchmark (mace_train.py, nequip_train.py, hydragnn_mace.py,
static_train.py) adds its model's own arguments, runs its trainer and writes its record
(:mod:`benchmarks.record`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.record import add_out_argument

ROOT = Path(__file__).resolve().parents[1]


def plugin_configs(adapter: str) -> dict[str, str]:
    """label -> ``--enable`` value: stock (the adapter alone), binpack, fused, both."""
    return {
        "stock": adapter,
        "binpack": f"{adapter},binpack",
        "fused": f"{adapter},fused",
        "both": f"{adapter},binpack,fused",
    }


def parser(doc: str, max_atoms: int, work: str) -> argparse.ArgumentParser:
    """The arguments every training benchmark takes: data set size, epochs, batch size, the
    folder of its runs (``--work``) and of its record (``--out``)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--n-train", type=int, default=40, help="training structures")
    p.add_argument("--max-atoms", type=int, default=max_atoms, help="largest structure's atoms")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4, help="the trainer's batch size")
    p.add_argument(
        "--work",
        default=work,
        metavar="DIR",
        help=f"folder of the runs: data set, logs, step logs (default {work})",
    )
    add_out_argument(p)
    return p


def config_table(rows: dict, time_header: str, ratio_header: str, speedup: bool) -> list[str]:
    """Markdown rows, one per configuration: epoch time, its ratio to stock (``speedup``: stock /
    this, else this / stock), steps, and the LIF of the forward time and of the atoms."""
    base = rows["stock"]["epoch_s"]
    lines = [
        f"| configuration | {time_header} | {ratio_header} | steps | LIF (forward time) | LIF "
        "(atoms) |",
        "|---|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        ratio = base / r["epoch_s"] if speedup else r["epoch_s"] / base
        lines.append(
            f"| {label} | {r['epoch_s']:.2f} | {ratio:.2f}x | {r['steps']} | {r['lif']:.3f} | "
            f"{r['lif_atoms']:.3f} |"
        )
    return lines
