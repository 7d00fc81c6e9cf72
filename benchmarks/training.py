"""What the training benchmarks share: the four plugin configurations, the data-set arguments,
and where their tables go. Each benchmark (mace_train.py, nequip_train.py) adds its model's own
arguments and runs its trainer."""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRAGMENTS = ROOT / "docs" / "_fragments"


def plugin_configs(adapter: str) -> dict[str, str]:
    """label -> ``--enable`` value: stock (the adapter alone), binpack, fused, both."""
    return {
        "stock": adapter,
        "binpack": f"{adapter},binpack",
        "fused": f"{adapter},fused",
        "both": f"{adapter},binpack,fused",
    }


def parser(doc: str, max_atoms: int, out: str) -> argparse.ArgumentParser:
    """The arguments every training benchmark takes (data set size, epochs, batch size, output)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--n-train", type=int, default=40)
    p.add_argument("--max-atoms", type=int, default=max_atoms)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--out", default=out)
    return p


def write_fragment(name: str, lines: list[str]) -> int:
    """Print a benchmark's table and write it to docs/_fragments/<name>.md (what docs/benchmarks.md
    quotes); 0, the benchmark's exit status."""
    text = "\n".join(lines)
    print(text)
    FRAGMENTS.mkdir(parents=True, exist_ok=True)
    (FRAGMENTS / f"{name}.md").write_text(text)
    return 0


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
