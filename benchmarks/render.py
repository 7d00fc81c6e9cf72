"""Render the results page and README's headline table from the kept benchmark records.

    python -m benchmarks.render              # rewrite docs/benchmarks.md and README's block
    python -m benchmarks.render --check      # exit 1 with a diff where a committed file differs
    python -m benchmarks.render --pictures   # also redraw the pictures (docs/img/*.png)

A benchmark writes its result as one JSON record (``benchmarks/record.py``; what it holds:
:data:`REQUIRED`) into ``out/``; a maintainer publishes it by copying it into
``benchmarks/results/`` (the newest record of a workload replaces the older one: same file name)
and running this script. The page's order, headings and prose live in the template
``benchmarks/results/page.md`` (:func:`render_page`); README's rows are :data:`HEADLINE`. The
pictures are drawn from the records (``--pictures``, :data:`PICTURES`); the drift check
(``--check``, and ``tests/benchmarks/test_render.py``) compares the text only, and that every
picture named exists.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TEMPLATE = RESULTS / "page.md"
PAGE = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- results:headline -->", "<!-- /results -->"

#: a record (schema 1) holds ``workload``, ``title``, ``benchmark``, ``command``, ``description``,
#: ``device``, ``versions`` (name -> version, "unknown" where not known), ``date`` (YYYY-MM-DD),
#: ``commit`` and ``tables`` (each with ``columns`` and ``rows`` of equal length; optional ``name``,
#: ``caption``, and ``command``/``date``/``commit`` where a table comes from another run of the
#: same benchmark: :data:`TABLE_OPTIONAL`), and optionally (:data:`OPTIONAL`) ``notes`` (short
#: remarks), ``picture`` (``docs/img/*.png``) and ``headline`` (named figures, not rendered)
REQUIRED = {
    "schema": int,
    "workload": str,
    "title": str,
    "benchmark": str,
    "command": str,
    "description": str,
    "device": str,
    "versions": dict,
    "date": str,
    "commit": str,
    "tables": list,
}
OPTIONAL = {"notes": list, "picture": str, "headline": dict}
TABLE_OPTIONAL = {"name": str, "caption": str, "command": str, "date": str, "commit": str}
PLACEHOLDER = re.compile(r"^\{\{\s*(record\s+(?P<name>[\w.-]+)|machines)\s*\}\}$")


class RecordError(ValueError):
    """A record or the page template is not what the renderer needs (the message says where)."""


@dataclass(frozen=True)
class Rendered:
    page: str
    headline: str


# ----------------------------------------------------------------------------- records


def check_record(rec: object, where: str) -> dict:
    """Return ``rec`` if it is a schema-1 record, else raise :class:`RecordError` naming ``where``
    (the file) and the field that is missing or wrong."""
    if not isinstance(rec, dict):
        raise RecordError(f"{where}: a record is a JSON object, got {type(rec).__name__}")
    for field, kind in REQUIRED.items():
        if field not in rec:
            raise RecordError(f"{where}: required field '{field}' is missing")
        if not isinstance(rec[field], kind) or (kind is str and not rec[field].strip()):
            raise RecordError(
                f"{where}: field '{field}' must be a non-empty {kind.__name__}, got {rec[field]!r}"
            )
    if rec["schema"] != 1:
        raise RecordError(f"{where}: field 'schema' is {rec['schema']!r}; this renderer reads 1")
    for field, kind in OPTIONAL.items():
        if field in rec and not isinstance(rec[field], kind):
            raise RecordError(f"{where}: field '{field}' must be a {kind.__name__}")
    _check_date(rec["date"], where, "date")
    for name, version in rec["versions"].items():
        if not isinstance(version, str) or not version:
            raise RecordError(f"{where}: field 'versions' has {name}={version!r}; write 'unknown'")
    if not rec["tables"]:
        raise RecordError(f"{where}: field 'tables' is empty")
    for i, table in enumerate(rec["tables"]):
        _check_table(table, f"{where}: tables[{i}]")
    for note in rec.get("notes", []):
        if not isinstance(note, str):
            raise RecordError(f"{where}: field 'notes' holds {note!r}; notes are strings")
    picture = rec.get("picture")
    if picture is not None and not re.fullmatch(r"docs/img/[\w.-]+\.png", picture):
        raise RecordError(f"{where}: field 'picture' is {picture!r}; give docs/img/NAME.png")
    return rec


def _check_date(value: str, where: str, field: str) -> None:
    if not re.fullmatch(r"\d{4}-\d\d-\d\d", value):
        raise RecordError(f"{where}: field '{field}' is {value!r}; write YYYY-MM-DD")


def _check_table(table: object, where: str) -> None:
    if not isinstance(table, dict):
        raise RecordError(f"{where}: a table is an object with 'columns' and 'rows'")
    for field in ("columns", "rows"):
        if not isinstance(table.get(field), list):
            raise RecordError(f"{where}: required field '{field}' is missing or not a list")
    for field, kind in TABLE_OPTIONAL.items():
        if field in table and not isinstance(table[field], kind):
            raise RecordError(f"{where}: field '{field}' must be a {kind.__name__}")
    if "date" in table:
        _check_date(table["date"], where, "date")
    width = len(table["columns"])
    for j, row in enumerate(table["rows"]):
        if not isinstance(row, list) or len(row) != width:
            raise RecordError(
                f"{where}: rows[{j}] has {len(row) if isinstance(row, list) else '?'} cells "
                f"for {width} columns"
            )


def load_records(folder: Path = RESULTS) -> dict[str, dict]:
    """Every ``*.json`` record of ``folder``, checked, by file stem (sorted)."""
    records = {}
    for path in sorted(folder.glob("*.json")):
        where = _rel(path)
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise RecordError(f"{where}: not valid JSON ({err})") from None
        records[path.stem] = check_record(rec, where)
    if not records:
        raise RecordError(f"{_rel(folder)}: no records (*.json)")
    return records


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------- markdown


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        value = f"{value:g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: list, rows: list) -> list[str]:
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |"]
    lines.append("|" + "---|" * len(columns))
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def versions_text(versions: dict) -> str:
    return ", ".join(f"{name} {version}" for name, version in versions.items())


def render_record(rec: dict) -> str:
    """One record as Markdown: what it measures and where (command, device, versions, date,
    commit), its tables, notes and picture."""
    out = [
        rec["description"] + "  ",
        f"Measured with `{rec['command']}` on {rec['device']}; {versions_text(rec['versions'])}; "
        f"{rec['date']}, commit `{rec['commit']}`.",
        "",
    ]
    several = len(rec["tables"]) > 1
    for table in rec["tables"]:
        label = table.get("caption") or (table.get("name") if several else None)
        if any(k in table for k in ("command", "date", "commit")):
            label = (
                f"{label or 'this table'} ({table.get('date', rec['date'])}, commit "
                f"`{table.get('commit', rec['commit'])}`, `{table.get('command', rec['command'])}`)"
            )
        if label:
            out += [f"*{label[0].upper()}{label[1:]}:*", ""]
        out += markdown_table(table["columns"], table["rows"])
        out.append("")
    out += [f"- {note}" for note in rec.get("notes", [])]
    if rec.get("notes"):
        out.append("")
    if rec.get("picture"):
        out += [f"![{rec['title']}]({Path(rec['picture']).relative_to('docs').as_posix()})", ""]
    return "\n".join(out).rstrip("\n")


def short_device(device: str) -> str:
    """The device without its parenthesised details: 'NVIDIA H200 (143771 MiB)' -> 'NVIDIA H200'."""
    return re.sub(r"\s*\(.*?\)", "", device)


def _device_key(device: str) -> tuple:
    return (0 if "cpu" in device.lower() else 1, device)


def render_machines(records: dict[str, dict]) -> str:
    """The machines the records name, with every version they give (known ones first)."""
    by_device: dict[str, list[dict]] = {}
    for rec in records.values():
        by_device.setdefault(rec["device"], []).append(rec)
    rows = []
    for device in sorted(by_device, key=_device_key):
        recs = by_device[device]
        versions: dict[str, list[str]] = {}
        for rec in recs:
            for name, version in rec["versions"].items():
                if version not in versions.setdefault(name, []):
                    versions[name].append(version)
        text = "; ".join(
            f"{name} {', '.join(sorted(v for v in vs if v != 'unknown')) or 'unknown'}"
            for name, vs in sorted(versions.items(), key=lambda kv: kv[0].lower())
        )
        dates = sorted(
            {r["date"] for r in recs}
            | {t["date"] for r in recs for t in r["tables"] if "date" in t}
        )
        span = dates[0] if dates[0] == dates[-1] else f"{dates[0]} .. {dates[-1]}"
        rows.append([device, text, span, str(len(recs))])
    return "\n".join(markdown_table(["machine", "versions named", "dates", "records"], rows))


def render_page(records: dict[str, dict], template: str, template_name: str = "page.md") -> str:
    """The results page: ``template`` with its placeholders filled from ``records``. The
    template (``benchmarks/results/page.md``) holds the page's order, headings and the prose
    around the tables; a line ``{{record NAME}}`` there stands for
    ``benchmarks/results/NAME.json`` rendered, ``{{machines}}`` for the table of the machines and
    versions the records name. Every record must be placed once, so that a published result
    cannot go missing from the page."""
    used: set[str] = set()
    out = []
    for number, line in enumerate(template.splitlines(), 1):
        match = PLACEHOLDER.match(line.strip())
        if not match:
            if "{{" in line:
                raise RecordError(
                    f"{template_name}:{number}: unknown placeholder {line.strip()!r} (use "
                    "{{record NAME}} or {{machines}})"
                )
            out.append(line)
            continue
        name = match.group("name")
        if name is None:
            out.append(render_machines(records))
            continue
        if name not in records:
            raise RecordError(
                f"{template_name}:{number}: no record benchmarks/results/{name}.json "
                f"(records: {', '.join(records)})"
            )
        if name in used:
            raise RecordError(f"{template_name}:{number}: record {name} is placed twice")
        used.add(name)
        out.append(render_record(records[name]))
    unused = [name for name in records if name not in used]
    if unused:
        raise RecordError(
            f"{template_name}: records not placed on the page: "
            + ", ".join(f"benchmarks/results/{n}.json" for n in unused)
            + " (add a line {{record NAME}} under the right heading)"
        )
    return "\n".join(out).rstrip("\n") + "\n"


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lstrip("#").strip().lower())
    return text.replace(" ", "-")


def sections(template: str) -> dict[str, str]:
    """Record name -> the anchor of the ``##`` heading it sits under in the template."""
    where, current = {}, ""
    for line in template.splitlines():
        if line.startswith("## "):
            current = anchor(line)
        match = PLACEHOLDER.match(line.strip())
        if match and match.group("name"):
            where[match.group("name")] = current
    return where


@dataclass(frozen=True)
class HeadlineRow:
    """One row of README's table: the figure in ``column`` of the rows of table ``table`` that
    match ``ways[way]`` (column -> cell text; a way of None was not measured), in each of the
    records ``record`` names (``benchmarks/results/<name>.json``; one name or a tuple of the
    runs of the same workload on the same device). Several runs show as a range; a ratio is
    taken within each run, never across runs."""

    what: str
    record: str | tuple[str, ...]
    table: str
    column: str
    unit: str
    ways: dict

    @property
    def records(self) -> tuple[str, ...]:
        return (self.record,) if isinstance(self.record, str) else tuple(self.record)


#: README's rows: each names a record, a table, a column and the rows of stock, cuEquivariance and
#: ours, so that a newer record of the same workload updates README too, and one that lacks them is
#: an error
HEADLINE = (
    HeadlineRow(
        "MACE epoch, 2 CPU ranks, float64",
        "mace_train_cpu",
        "epoch",
        "optimizer steps per epoch (s, slowest rank)",
        "s",
        {
            "stock": {"configuration": "stock"},
            "cuEquivariance": None,
            "ours": {"configuration": "both"},
        },
    ),
    *(
        HeadlineRow(
            f"MACE train step, 4000 atoms, {dtype}",
            ("gpu_mace_step-h200-all-backends", "gpu_mace_step-h200"),
            "step",
            "train ms",
            "ms",
            {
                "stock": {"dtype": dtype, "atoms": "4000", "way": "stock"},
                "cuEquivariance": {"dtype": dtype, "atoms": "4000", "way": "cueq"},
                "ours": {"dtype": dtype, "atoms": "4000", "way": "fused[triton]"},
            },
        )
        for dtype in ("float32", "float64")
    ),
    HeadlineRow(
        "MACE train step, 2048 atoms, float64",
        "gpu_mace_step-h200",
        "step",
        "train ms",
        "ms",
        {
            "stock": None,
            "cuEquivariance": {"dtype": "float64", "atoms": "2048", "way": "cueq"},
            "ours": {"dtype": "float64", "atoms": "2048", "way": "fused[triton]"},
        },
    ),
)

WAYS = ("stock", "cuEquivariance", "ours")


def _figure(rec: dict, spec: HeadlineRow, way: str, name: str) -> str | None:
    """The cell of ``way`` in record ``name``; None where the way was not measured or (a record
    of several) that run has no such row."""
    where = f"README headline '{spec.what}': benchmarks/results/{name}.json"
    match = spec.ways[way]
    if match is None:
        return None
    tables = [t for t in rec["tables"] if t.get("name") == spec.table]
    if not tables:
        raise RecordError(f"{where} has no table '{spec.table}'")
    columns = tables[0]["columns"]
    missing = [c for c in (spec.column, *match) if c not in columns]
    if missing:
        raise RecordError(f"{where}: table '{spec.table}' has no column {', '.join(missing)}")
    rows = [
        r for r in tables[0]["rows"] if all(str(r[columns.index(c)]) == v for c, v in match.items())
    ]
    if len(rows) == 0 and len(spec.records) > 1:
        return None
    if len(rows) != 1:
        raise RecordError(f"{where}: {len(rows)} rows of table '{spec.table}' match {match}")
    return cell(rows[0][columns.index(spec.column)])


def _span(values: list[float], fmt: str) -> str:
    low, high = min(values), max(values)
    return (
        fmt.format(low)
        if fmt.format(low) == fmt.format(high)
        else f"{fmt.format(low)}-{fmt.format(high)}"
    )


def headline_cells(records: dict[str, dict], spec: HeadlineRow) -> dict[str, str]:
    """The stock, cuEquivariance and ours cells of one row. A figure is bold only where it is the
    fastest of its row in every run; ours carries its ratios to the others, run by run."""
    for name in spec.records:
        if name not in records:
            raise RecordError(
                f"README headline '{spec.what}': no record benchmarks/results/{name}.json"
            )
    runs = [
        {w: _figure(records[n], spec, w, n) for w in WAYS} for n in spec.records
    ]  # one dict per run: way -> cell text or None
    runs = [r for r in runs if r["ours"] is not None]
    if not runs:
        raise RecordError(f"README headline '{spec.what}': no run measured ours")
    numbers = [{w: _number(v) for w, v in r.items() if v is not None} for r in runs]
    fastest = {min(n, key=n.get) if len(n) > 1 else None for n in numbers}
    bold = fastest.pop() if len(fastest) == 1 else None
    cells = {}
    for way in WAYS:
        texts = [r[way] for r in runs if r[way] is not None]
        if not texts:
            cells[way] = "-"
            continue
        values = [_number(t) for t in texts]
        text = texts[0] if len(set(texts)) == 1 else f"{min(values):g}-{max(values):g}"
        text = f"{text} {spec.unit}"
        cells[way] = f"**{text}**" if way == bold else text
    ratios = []
    for way, label in (("stock", "stock"), ("cuEquivariance", "cuEq.")):
        both = [n["ours"] / n[way] for n in numbers if way in n]
        if both:
            ratios.append(f"{_span(both, '{:.2f}')}x {label}")
    if ratios:
        cells["ours"] += f" ({', '.join(ratios)})"
    return cells


def render_headline(
    records: dict[str, dict],
    template: str,
    page: str = "docs/benchmarks.md",
    specs: tuple[HeadlineRow, ...] = HEADLINE,
) -> str:
    """README's headline table (``specs``), each row's ratios taken within its records."""
    where = sections(template)
    rows = []
    for spec in specs:
        cells = headline_cells(records, spec)
        first = records[spec.records[0]]
        rows.append(
            [
                f"[{spec.what}]({page}#{where.get(spec.records[0], '')})",
                short_device(first["device"]),
                *(cells[w] for w in WAYS),
            ]
        )
    lines = markdown_table(["measured", "device", "stock", "cuEquivariance", "cfm-plugins"], rows)
    lines += [
        "",
        "cfm-plugins: binpack + fused (on GPUs the fused kernels' Triton backend); in brackets its "
        "time over stock's and cuEquivariance's in the same run; a range where runs differ; bold: "
        "the fastest of the row in every run. All results with their commands, versions and "
        f"dates: [{page}]({page}).",
    ]
    return "\n".join(lines)


def replace_block(text: str, block: str, where: str = "README.md") -> str:
    """``text`` with the part between the headline markers replaced by ``block``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise RecordError(f"{where}: the markers {BEGIN} ... {END} are missing")
    return text[: start + len(BEGIN)] + "\n" + block + "\n" + text[end:]


def render(results: Path = RESULTS, readme_text: str | None = None) -> Rendered:
    """Render the page and the headline block from ``results`` (records and ``page.md``)."""
    records = load_records(results)
    template_path = results / "page.md"
    template = template_path.read_text(encoding="utf-8")
    page = render_page(records, template, _rel(template_path))
    headline = render_headline(records, template)
    for name, rec in records.items():
        if rec.get("picture") and not (ROOT / rec["picture"]).is_file():
            raise RecordError(
                f"benchmarks/results/{name}.json: picture {rec['picture']} does not exist "
                "(python -m benchmarks.render --pictures draws it)"
            )
    return Rendered(page, headline)


# ----------------------------------------------------------------------------- pictures


def _number(text: object) -> float:
    return float(re.sub(r"[^\d.eE+-]", "", str(text)))


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})


def _columns(table: dict, *names: str) -> dict[str, int]:
    missing = [n for n in names if n not in table["columns"]]
    if missing:
        raise RecordError(f"table '{table.get('name')}' has no column {', '.join(missing)}")
    return {n: table["columns"].index(n) for n in names}


def picture_sampler(rec: dict, path: Path) -> None:
    """Padding and step imbalance of each packer by rank count (log scales; a zero is drawn at
    the floor)."""
    import matplotlib.pyplot as plt

    table = rec["tables"][0]
    col = _columns(table, "W", "packer", "padding", "mean step imbalance")
    packers: dict[str, list] = {}
    for row in table["rows"]:
        packers.setdefault(str(row[col["packer"]]), []).append(row)
    floor = 1e-3  # percent
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.9))
    for packer, rows in packers.items():
        ranks = [_number(r[col["W"]]) for r in rows]
        padding = [_number(r[col["padding"]]) for r in rows]
        excess = [100 * (_number(r[col["mean step imbalance"]]) - 1) for r in rows]
        style = {"lw": 2.6 if "ours" in packer else 1.2, "marker": "o", "ms": 4, "label": packer}
        left.plot(ranks, [max(p, floor) for p in padding], **style)
        right.plot(ranks, [max(e, floor) for e in excess], **style)
    ticks = sorted({_number(r[col["W"]]) for r in table["rows"]})
    for ax, ylabel in (
        (left, "padding (% of the bins)"),
        (right, "mean step imbalance - 1 (%)"),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_xlabel("ranks")
        ax.set_ylabel(ylabel)
        ax.axhline(floor, color="0.6", lw=0.8, ls="--")
        ax.grid(alpha=0.3)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.suptitle(
        "Bin packing on the Table-3 mix: lower is better (dashed: 0.001 %, where 0 is drawn)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    _save(fig, path)
    plt.close(fig)


def picture_gpu_mace_step(rec: dict, path: Path) -> None:
    """The train step by batch size, per way and dtype."""
    import matplotlib.pyplot as plt

    table = rec["tables"][0]
    col = _columns(table, "dtype", "atoms", "way", "train ms")
    names = {"cueq": "cuEquivariance", "fused[triton]": "ours (Triton)", "stock": "stock"}
    colors = {"cueq": "tab:gray", "fused[triton]": "tab:blue", "stock": "tab:red"}
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for dtype, marker in (("float64", "o"), ("float32", "s")):
        for way in names:
            rows = [r for r in table["rows"] if r[col["dtype"]] == dtype and r[col["way"]] == way]
            if not rows:
                continue
            ax.plot(
                [_number(r[col["atoms"]]) for r in rows],
                [_number(r[col["train ms"]]) for r in rows],
                marker=marker,
                color=colors[way],
                ls="-" if dtype == "float64" else "",
                label=f"{names[way]}, {dtype}",
            )
    ax.set_xlabel("atoms in the batch")
    ax.set_ylabel("train step (ms)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"MACE-MP-medium-like train step, {short_device(rec['device'])}", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


PICTURES = {"sampler": picture_sampler, "gpu_mace_step": picture_gpu_mace_step}


def draw_pictures(records: dict[str, dict]) -> list[Path]:
    """Draw the picture of every record whose workload has a drawing here; return the paths."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "cfm-plugins"
    drawn = []
    for rec in records.values():
        draw = PICTURES.get(rec["workload"])
        if draw and rec.get("picture"):
            path = ROOT / rec["picture"]
            draw(rec, path)
            drawn.append(path)
    return drawn


# ----------------------------------------------------------------------------- main


def _diff(old: str, new: str, name: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(True), new.splitlines(True), f"{name} (committed)", f"{name} (rendered)"
        )
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.render", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a diff where a file differs",
    )
    ap.add_argument(
        "--pictures", action="store_true", help="also redraw docs/img/ from the records"
    )
    args = ap.parse_args(argv)
    try:
        if args.pictures and not args.check:
            for path in draw_pictures(load_records()):
                print(f"drew {_rel(path)}")
        readme = README.read_text(encoding="utf-8")
        rendered = render()
        targets = {
            PAGE: rendered.page,
            README: replace_block(readme, rendered.headline),
        }
    except RecordError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stale = []
    for path, text in targets.items():
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old == text:
            continue
        stale.append(path)
        if args.check:
            sys.stdout.write(_diff(old, text, _rel(path)))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {_rel(path)}")
    if args.check and stale:
        print(
            f"{', '.join(_rel(p) for p in stale)} differ from the records: run "
            "python -m benchmarks.render",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
