"""What ``cfm-plan`` prints, writes as JSON and draws.

- :func:`text`: for people, one table per rank count (binpack against the trainer's own batches)
  and a summary of every rank count (epoch time, speedup, parallel efficiency);
- :func:`efficiency`: strong-scaling efficiency ``T(W0) W0 / (T(W) W)`` against the smallest rank
  count ``W0`` planned (the MACE paper's definition, section 5.4.1);
- :func:`draw`: the strong-scaling picture in the style of the MACE paper's Figure 7 (epoch time
  against GPUs, log-log, with ideal scaling) beside the LIF at every rank count.
"""

from __future__ import annotations

from .predict import fmt_time as _fmt_time


def efficiency(results: list[dict], key: str) -> dict[int, float]:
    """Strong-scaling efficiency of ``key`` (``binpack`` or ``stock``) at every rank count."""
    rows = [r for r in results if r[key].get("epoch_s")]
    if not rows:
        return {}
    first = min(rows, key=lambda r: r["ranks"])
    t0 = first[key]["epoch_s"] * first["ranks"]
    return {r["ranks"]: t0 / (r[key]["epoch_s"] * r["ranks"]) for r in rows}


def _spread(d: dict, name: str, fmt: str) -> str:
    v = d.get(name)
    if v is None:
        return "-"
    lo, hi = d.get(f"{name}_min"), d.get(f"{name}_max")
    if lo is None or hi is None or lo == hi:
        return format(v, fmt)
    return f"{format(v, fmt)} [{format(lo, fmt)}..{format(hi, fmt)}]"


def text(plan: dict) -> str:
    """The plan for people (see the module notes)."""
    out = []
    data = plan["data"]
    out.append(
        f"data: {data['structures']:,} structures, {data['atoms']:,} atoms"
        + (f", {data['edges']:,} edges at r_max {data['r_max']:g}" if data.get("edges") else "")
        + f" ({len(data['files'])} file{'s' if len(data['files']) != 1 else ''})"
    )
    out.append(f"  not planned: {plan['excluded_text']}")
    b = plan["binpack"]
    out.append(
        f"binpack: cost {b['cost']}, capacity {b['capacity']:g} ({b['capacity_rule']}), seed "
        f"{b['seed']}, epoch {b['epoch']}, oversize {b['oversize']}"
    )
    s = plan["stock"]
    out.append(
        f"trainer's own batches: {s['batch_size']} graphs per rank and step, DistributedSampler "
        f"({'drop_last' if s['drop_last'] else 'padded'}), {s['orders']} orders (seeds "
        f"{s['seeds']}): median [min..max]"
    )
    t = plan.get("time")
    if t:
        out.append(f"step time: {t['model']} ({t['source']})")
        out.append(f"all-reduce: {t['allreduce']}")
    for w in plan["warnings"]:
        out.append(f"warning: {w}")
    for r in plan["results"]:
        out.append("")
        out.append(f"ranks {r['ranks']}")
        head = (
            f"  {'':22s}{'steps':>7s} {'graphs/batch':>13s} {'atoms/batch':>12s} "
            f"{'largest (atoms)':>22s} {'padding':>8s} {'LIF':>24s} {'straggler':>24s}"
        )
        if t:
            head += f" {'epoch':>24s}"
        out.append(head)
        for label, d in (("binpack", r["binpack"]), ("stock", r["stock"])):
            if not d.get("steps"):
                out.append(f"  {label:22s} no steps: {d.get('why', 'too few structures')}")
                continue
            lif_key = "lif_time" if t else "lif"
            line = (
                f"  {label:22s}{d['steps']:>7d} {d['graphs_per_batch']:>13.1f} "
                f"{d['atoms_per_batch']:>12.0f} {_spread(d, 'largest_batch_atoms', '.0f'):>22s} "
                f"{100 * d['padding']:>7.1f}% {_spread(d, lif_key, '.4f'):>24s} "
                f"{_spread(d, 'straggler_ratio', '.4f'):>24s}"
            )
            if t:
                e = d["epoch_s"]
                lo, hi = d.get("epoch_s_min"), d.get("epoch_s_max")
                rng = f" [{_fmt_time(lo)}..{_fmt_time(hi)}]" if lo is not None and lo != hi else ""
                line += f" {_fmt_time(e) + rng:>24s}"
            out.append(line)
        b, st = r["binpack"], r["stock"]
        said = []
        if b.get("repeated"):
            said.append(
                f"{b['repeated']} repeated so that every rank has a batch at every step (too "
                "few structures for the ranks)"
            )
        if b.get("skipped"):
            said.append(f"{b['skipped']} oversize structure(s) skipped (--oversize skip)")
        if b.get("solo"):
            said.append(f"{b['solo']} oversize structure(s) alone in a batch (--oversize solo)")
        out.append(
            "  binpack: "
            + ("; ".join(said) if said else "every structure once, nothing dropped or repeated")
        )
        said = []
        if st.get("dropped"):
            said.append(
                f"{st['dropped']} dropped per epoch (DistributedSampler's drop_last: the last "
                f"n % {r['ranks']} of each epoch's order, others each epoch)"
            )
        if st.get("repeated"):
            said.append(f"{st['repeated']} repeated per epoch (DistributedSampler's padding)")
        if not st.get("steps"):
            said.append("no batch: fewer structures than ranks")
        out.append(
            "  trainer's own: "
            + ("; ".join(said) if said else "every structure once, nothing dropped or repeated")
        )
        if "speedup" in r:
            out.append(f"  speedup {r['speedup']:.2f}x (the trainer's own epoch / binpack's)")
    if t and len(plan["results"]) > 1:
        eb, es = plan["efficiency"]["binpack"], plan["efficiency"]["stock"]
        out.append("")
        out.append(
            f"{'ranks':>6s} {'epoch stock':>14s} {'epoch binpack':>14s} {'speedup':>8s} "
            f"{'efficiency stock':>17s} {'efficiency binpack':>19s}"
        )
        for r in plan["results"]:
            w = r["ranks"]
            st = r["stock"].get("epoch_s")
            out.append(
                f"{w:>6d} {(_fmt_time(st) if st else '-'):>14s} "
                f"{_fmt_time(r['binpack']['epoch_s']):>14s} "
                f"{(format(r['speedup'], '.2f') + 'x') if 'speedup' in r else '-':>8s} "
                f"{(format(100 * es[w], '.1f') + '%') if w in es else '-':>17s} "
                f"{(format(100 * eb[w], '.1f') + '%') if w in eb else '-':>19s}"
            )
        out.append(
            "efficiency: T(W0) W0 / (T(W) W) against the smallest rank count W0 (MACE paper, "
            "section 5.4.1)"
        )
    return "\n".join(out)


def draw(plan: dict, path: str, title: str | None = None, references: dict | None = None) -> str:
    """The strong-scaling picture (see the module notes), saved as a PNG at ``path``.

    ``references``: other epoch times to set beside the plan's, ``{label: {ranks: minutes}}``
    (e.g. a paper's measured ones), drawn as hollow markers."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    res = plan["results"]
    ranks = [r["ranks"] for r in res]
    timed = bool(plan.get("time"))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.4))
    key = "epoch_s" if timed else "epoch_cost"
    scale = 60.0 if timed else 1.0
    for label, side, color, marker in (
        ("trainer's own batches", "stock", "tab:red", "o"),
        ("binpack", "binpack", "tab:blue", "s"),
    ):
        pts = [(r["ranks"], r[side]) for r in res if r[side].get(key)]
        if not pts:
            continue
        xs = [w for w, _ in pts]
        ys = [d[key] / scale for _, d in pts]
        lo = [(d[key] - d.get(f"{key}_min", d[key])) / scale for _, d in pts]
        hi = [(d.get(f"{key}_max", d[key]) - d[key]) / scale for _, d in pts]
        ax.errorbar(xs, ys, yerr=[lo, hi], color=color, marker=marker, label=label, capsize=3)
        ax.plot(
            xs,
            [ys[0] * xs[0] / w for w in xs],
            color=color,
            linestyle=":",
            linewidth=1,
            label=f"ideal ({label})",
        )
        lif = "lif_time" if timed else "lif"
        bx.errorbar(
            xs,
            [d[lif] for _, d in pts],
            yerr=[
                [d[lif] - d.get(f"{lif}_min", d[lif]) for _, d in pts],
                [d.get(f"{lif}_max", d[lif]) - d[lif] for _, d in pts],
            ],
            color=color,
            marker=marker,
            label=label,
            capsize=3,
        )
    for k, (label, pts) in enumerate((references or {}).items()):
        xs = sorted(pts)
        ax.plot(
            xs,
            [pts[w] for w in xs],
            linestyle="--",
            marker="ov^"[k % 3],
            markerfacecolor="none",
            color=("tab:gray", "tab:green", "tab:purple")[k % 3],
            label=label,
        )
    for r in res:
        if "speedup" in r:
            ax.annotate(
                f"{r['speedup']:.1f}x",
                (r["ranks"], r["binpack"][key] / scale),
                textcoords="offset points",
                xytext=(0, -14),
                ha="center",
                fontsize=8,
                color="tab:blue",
            )
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xticks(ranks)
        a.set_xticklabels([str(w) for w in ranks], fontsize=8)
        a.set_xlabel("GPUs (ranks)")
        a.grid(True, which="both", alpha=0.3)
    ax.set_yscale("log")
    ax.margins(y=0.12)
    ax.set_ylabel("predicted epoch time (min)" if timed else "epoch cost (sum of step maxima)")
    ax.set_title("strong scaling" + ("" if timed else " (no step-time model: cost units)"))
    ax.legend(fontsize=7, loc="lower left")
    bx.set_ylabel("LIF (sum of step max / sum of step mean)")
    bx.set_title("load imbalance factor")
    bx.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
