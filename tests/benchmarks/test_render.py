"""benchmarks/render.py: the results page and README's headline table come from the kept records.

The first test is the drift check: docs/benchmarks.md and README's block between the headline
markers must equal what the render script makes from benchmarks/results/ (run
``python -m benchmarks.render`` after changing a record or the page template).
"""

from __future__ import annotations

import json

import pytest

from benchmarks import render

RECORD = {
    "schema": 1,
    "workload": "tiny",
    "title": "A tiny workload",
    "benchmark": "benchmarks/tiny.py",
    "command": "python -m benchmarks.tiny --n 2",
    "description": "Two configurations of nothing much.",
    "device": "x86_64 CPU, 2 cores",
    "versions": {"python": "3.11.7", "torch": "unknown"},
    "date": "2026-11-27",
    "commit": "abc1234",
    "tables": [
        {
            "name": "epoch",
            "columns": ["way", "epoch s", "vs stock"],
            "rows": [["stock", 2.5, "1.00x"], ["ours", 1.25, "0.50x"], ["a|b", None, 3]],
        }
    ],
    "notes": ["Read the ratio, not the time."],
}

TEMPLATE = """\
# Results

{{machines}}

## Tiny things

Intro.

{{record tiny}}
"""


def test_committed_page_and_readme_equal_the_render_of_the_records(capsys):
    code = render.main(["--check"])
    out, err = capsys.readouterr()
    assert code == 0, f"docs/benchmarks.md or README.md drifted from the records:\n{out}{err}"


def test_a_record_missing_a_required_field_is_an_error_naming_the_file_and_field(tmp_path):
    record = dict(RECORD)
    del record["commit"]
    (tmp_path / "tiny.json").write_text(json.dumps(record))
    with pytest.raises(render.RecordError, match=r"tiny\.json: required field 'commit' is missing"):
        render.load_records(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"date": "27.11.2026"}, r"tiny\.json: field 'date' is '27\.11\.2026'; write YYYY-MM-DD"),
        (
            {"versions": {"torch": ""}},
            r"tiny\.json: field 'versions' has torch=''; write 'unknown'",
        ),
        ({"picture": "docs/x.png"}, r"tiny\.json: field 'picture' is 'docs/x\.png'"),
        (
            {"tables": [{"columns": ["a", "b"], "rows": [["1"]]}]},
            r"tiny\.json: tables\[0\]: rows\[0\] has 1 cells for 2 columns",
        ),
    ],
)
def test_a_malformed_record_says_where(tmp_path, change, message):
    (tmp_path / "tiny.json").write_text(json.dumps(RECORD | change))
    with pytest.raises(render.RecordError, match=message):
        render.load_records(tmp_path)


def test_a_tiny_record_set_renders_the_expected_page():
    page = render.render_page({"tiny": RECORD}, TEMPLATE)
    assert page == (
        "# Results\n\n| machine | versions named | dates | records |\n|---|---|---|---|\n| x86_64 "
        "CPU, 2 cores | python 3.11.7; torch unknown | 2026-11-27 | 1 |\n\n## Tiny "
        "things\n\nIntro.\n\nTwo configurations of nothing much.  \nMeasured with `python -m "
        "benchmarks.tiny --n 2` on x86_64 CPU, 2 cores; python 3.11.7, torch unknown; 2026-11-27, "
        "commit `abc1234`.\n\n| way | epoch s | vs stock |\n|---|---|---|\n| stock | 2.5 | 1.00x "
        "|\n| ours | 1.25 | 0.50x |\n| a\\|b | - | 3 |\n\n- Read the ratio, not the time.\n"
    )


def test_a_table_from_another_run_names_its_own_date_commit_and_command():
    record = json.loads(json.dumps(RECORD))
    record["tables"].append(
        {"name": "older", "columns": ["x"], "rows": [[1]], "date": "2026-11-20", "commit": "0ld"}
    )
    text = render.render_record(record)
    assert "*Epoch:*" in text
    assert "*Older (2026-11-20, commit `0ld`, `python -m benchmarks.tiny --n 2`):*" in text


def test_every_record_is_placed_once_and_every_placeholder_has_a_record():
    with pytest.raises(render.RecordError, match=r"not placed on the page: .*results/other\.json"):
        render.render_page({"tiny": RECORD, "other": RECORD}, TEMPLATE)
    with pytest.raises(render.RecordError, match=r"page\.md:9: no record .*results/tiny\.json"):
        render.render_page({"other": RECORD}, TEMPLATE)
    with pytest.raises(render.RecordError, match=r"page\.md:1: unknown placeholder"):
        render.render_page({"tiny": RECORD}, "{{tables}}\n{{record tiny}}\n")


def test_the_headline_takes_its_figures_and_ratios_from_one_record():
    spec = render.HeadlineRow(
        "tiny epoch", "tiny", "epoch", "epoch s", "s",
        {"stock": {"way": "stock"}, "cuEquivariance": None, "ours": {"way": "ours"}},
    )  # fmt: skip
    text = render.render_headline({"tiny": RECORD}, TEMPLATE, specs=(spec,))
    assert (
        "| [tiny epoch](docs/benchmarks.md#tiny-things) | x86_64 CPU, 2 cores | 2.5 s | - | "
        "**1.25 s** (0.50x stock) |"
    ) in text
    missing = render.HeadlineRow("gone", "tiny", "epoch", "train ms", "ms", spec.ways)
    with pytest.raises(render.RecordError, match="table 'epoch' has no column train ms"):
        render.render_headline({"tiny": RECORD}, TEMPLATE, specs=(missing,))


def test_the_headline_bolds_only_the_fastest_and_shows_a_range_over_runs():
    def run(stock, cueq, ours):
        rows = [["stock", stock, "-"], ["cueq", cueq, "-"], ["ours", ours, "-"]]
        return {**RECORD, "tables": [{**RECORD["tables"][0], "rows": rows}]}

    ways = {"stock": {"way": "stock"}, "cuEquivariance": {"way": "cueq"}, "ours": {"way": "ours"}}
    spec = render.HeadlineRow("tiny epoch", ("a", "b"), "epoch", "epoch s", "s", ways)
    # ours fastest in one run, cuEquivariance in the other: nothing is bold
    cells = render.headline_cells({"a": run(4.0, 2.0, 1.0), "b": run(4.0, 1.0, 2.0)}, spec)
    assert cells == {
        "stock": "4 s",
        "cuEquivariance": "1-2 s",
        "ours": "1-2 s (0.25-0.50x stock, 0.50-2.00x cuEq.)",
    }
    # cuEquivariance fastest in both runs: its cell is bold, ours is not
    cells = render.headline_cells({"a": run(4.0, 1.0, 2.0), "b": run(4.0, 1.5, 3.0)}, spec)
    assert cells["cuEquivariance"] == "**1-1.5 s**" and not cells["ours"].startswith("**")
    # ours fastest in every run: bold
    cells = render.headline_cells({"a": run(4.0, 2.0, 1.0), "b": run(4.0, 2.0, 1.0)}, spec)
    assert cells["ours"] == "**1 s** (0.25x stock, 0.50x cuEq.)"


def test_the_readme_block_is_replaced_between_the_markers_only():
    text = f"intro\n{render.BEGIN}\nold\n{render.END}\nrest\n"
    assert render.replace_block(text, "new") == f"intro\n{render.BEGIN}\nnew\n{render.END}\nrest\n"
    with pytest.raises(render.RecordError, match="markers"):
        render.replace_block("no markers here", "new")


def test_the_pictures_are_drawn_from_the_records(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    records = render.load_records()
    for name, draw in (("sampler", render.picture_sampler),
                       ("gpu_mace_step-h200", render.picture_gpu_mace_step)):  # fmt: skip
        path = tmp_path / f"{name}.png"
        draw(records[name], path)
        assert path.read_bytes().startswith(b"\x89PNG")
        assert path.stat().st_size < 100_000


def test_a_record_the_writer_makes_is_one_the_renderer_reads(tmp_path, capsys):
    from benchmarks.record import table, write_record

    write_record(
        "tiny",
        "A tiny workload",
        [table("epoch", ["way", "epoch s"], [["stock", "2.50"], ["ours", "1.25"]], "seconds")],
        description="Two configurations of nothing much.",
        headline={"ours / stock": "0.50x"},
        out=tmp_path,
        command="python -m benchmarks.tiny",
        benchmark="benchmarks.tiny",
    )
    capsys.readouterr()
    records = render.load_records(tmp_path)
    text = render.render_record(records["tiny"])
    assert "| ours | 1.25 |" in text
    assert "Measured with `python -m benchmarks.tiny` on " in text
