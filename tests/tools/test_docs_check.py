"""The docs check (``tools/docs_check.py``, ``make docs-check``): it finds the blocks a user
copies, honours its directives, runs a page's blocks in order as a reader would (one shell session:
``cd`` and variables carry over; one Python interpreter: names carry over; no hidden set-up), and
fails on a copyable block without a directive, on a block that needs a later one and on a broken
link or anchor."""

import textwrap

import pytest

from tools import docs_check

FENCE = "```"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).replace("'''", FENCE))
    return path


def run(*args):
    return docs_check.main([str(a) for a in args])


def test_it_finds_blocks_with_their_directives_and_languages(tmp_path):
    doc = docs_check.parse(
        write(
            tmp_path,
            "a.md",
            """\
            # Title

            <!-- docs-check: replace -np 4 => -np 2; expect done -->
            '''bash
            mpirun -np 4 echo done
            '''

            - an item:
              <!-- docs-check: skip: needs a GPU -->
              '''python
              import torch
              '''

            '''text
            make test   # output, not a command
            '''
            """,
        )
    )
    assert [(b.line, b.lang) for b in doc.blocks] == [(4, "bash"), (10, "python"), (14, "text")]
    bash, python, text = doc.blocks
    assert bash.directives == [("replace", "-np 4 => -np 2"), ("expect", "done")]
    assert docs_check.substituted(bash) == "mpirun -np 2 echo done\n"
    assert python.text == "import torch\n"  # the list item's indent is taken off
    steps, problems = docs_check.plan(doc)
    assert problems == []
    assert [(action, note) for _, action, note in steps] == [
        ("run", ""),
        ("skip", "needs a GPU"),
        ("none", ""),
    ]


def test_a_copyable_block_without_a_directive_fails_and_so_does_an_unlabeled_command(
    tmp_path, capsys
):
    path = write(
        tmp_path,
        "b.md",
        """\
        '''bash
        echo hello
        '''

        '''
        make demo
        '''

        <!-- docs-check: skip -->
        '''python
        pass
        '''
        """,
    )
    assert run(path) == 1
    out = capsys.readouterr().out
    assert "b.md:1: a `bash` block without a docs-check directive" in out
    assert "b.md:5: an unlabeled block that looks like a command" in out
    assert "b.md:10: `skip` needs a reason" in out


def test_broken_links_and_anchors_fail_and_good_ones_pass(tmp_path, capsys):
    write(tmp_path, "other.md", "# Other page\n\n## Static shapes and `compile`\n")
    path = write(
        tmp_path,
        "c.md",
        """\
        # Here

        [fine](other.md#static-shapes-and-compile), [also](#here), [web](https://example.org),
        [gone](missing.md), [no heading](other.md#nowhere), `[in code](missing2.md)`
        """,
    )
    assert run(path, "--links-only") == 1
    out = capsys.readouterr().out
    assert "c.md:4: link to missing.md: no file" in out
    assert "c.md:4: link to other.md#nowhere: " in out and "other.md has no heading #nowhere" in out
    assert "static-shapes" not in out and "#here" not in out and "missing2" not in out
    assert "2 other problem(s)" in out


def test_blocks_run_in_order_as_one_user_session(tmp_path, capsys):
    path = write(
        tmp_path,
        "d.md",
        """\
        <!-- docs-check: run -->
        '''bash
        mkdir -p sub && cd sub && echo 'value: 3' > conf.yaml
        '''

        <!-- docs-check: file data.json -->
        '''json
        {"n": 2}
        '''

        <!-- docs-check: run -->
        '''python
        import json
        '''

        <!-- docs-check: run -->
        '''python
        n = json.load(open("data.json"))["n"]   # the shell's cd and the import carried over
        '''

        <!-- docs-check: expect n=2 yes -->
        '''python
        import os
        print(f"n={n}", "yes" if os.path.exists("conf.yaml") else "no")
        '''

        <!-- docs-check: expect /sub; expect mpirun is a function -->
        '''bash
        pwd; type mpirun | sed -n 1p  # sed reads it all: no SIGPIPE under pipefail
        '''
        """,
    )
    assert run(path) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "6 blocks passed, 0 failed, 0 skipped" in out


def test_shell_blocks_share_their_variables_and_python_starts_from_the_shell(tmp_path, capsys):
    path = write(
        tmp_path,
        "vars.md",
        """\
        <!-- docs-check: run -->
        '''bash
        export RUN_NAME=first OMP_NUM_THREADS=2
        unset HOME
        steps=(1 2 3)
        '''

        <!-- docs-check: expect first 2 3 home:unset -->
        '''bash
        echo "$RUN_NAME $OMP_NUM_THREADS ${#steps[@]} home:${HOME-unset}"
        '''

        <!-- docs-check: run -->
        '''bash
        export RUN_NAME=second
        '''

        <!-- docs-check: expect second from python -->
        '''python
        import os
        print(os.environ["RUN_NAME"], "from python")
        '''
        """,
    )
    assert run(path) == 0, capsys.readouterr().out
    assert "4 blocks passed, 0 failed" in capsys.readouterr().out


def test_a_block_that_needs_a_later_block_fails(tmp_path, capsys):
    """Blocks run in page order: a name or a variable a later block defines is not there yet."""
    path = write(
        tmp_path,
        "later.md",
        """\
        <!-- docs-check: run -->
        '''python
        print(model_name)
        '''

        <!-- docs-check: run -->
        '''python
        model_name = "my.model"
        '''

        <!-- docs-check: run -->
        '''bash
        test -n "$DATA_DIR"
        '''

        <!-- docs-check: run -->
        '''bash
        export DATA_DIR=examples/out/data
        '''
        """,
    )
    assert run(path) == 1
    out = capsys.readouterr().out
    assert "NameError: name 'model_name' is not defined" in out
    statuses = [ln.split()[0] for ln in out.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert statuses[:4] == ["FAIL", "PASS", "FAIL", "PASS"]
    assert "2 blocks passed, 2 failed" in out


def test_a_failing_block_a_missing_replacement_and_a_bad_parse_fail(tmp_path, capsys):
    path = write(
        tmp_path,
        "e.md",
        """\
        <!-- docs-check: run -->
        '''bash
        false
        echo not reached
        '''

        <!-- docs-check: replace --epochs 5 => --epochs 1 -->
        '''bash
        echo --epochs 2
        '''

        <!-- docs-check: parse -->
        '''yaml
        a: [1, 2
        '''

        <!-- docs-check: expect PatchReport(counts= -->
        '''python
        print("PatchReport(swapped={})")
        '''
        """,
    )
    assert run(path) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "not reached" not in out
    assert "replace '--epochs 5': not in the block" in out
    assert "the output lacks 'PatchReport(counts='" in out
    assert "0 blocks passed, 4 failed" in out


def test_a_file_level_skip_and_an_unknown_directive(tmp_path, capsys):
    skipped = write(
        tmp_path,
        "f.md",
        """\
        <!-- docs-check-file: skip: results page; its commands are benchmarks -->
        '''bash
        python -m benchmarks.mace_train
        '''
        """,
    )
    assert run(skipped) == 0
    assert "SKIP" in capsys.readouterr().out
    bad = write(tmp_path, "g.md", "<!-- docs-check: runn -->\n'''bash\ntrue\n'''\n")
    with pytest.raises(docs_check.DocError, match="unknown docs-check directive 'runn'"):
        docs_check.parse(bad)


def test_directives_on_several_lines_and_no_hidden_set_up():
    body = """replace -np 4 => -np 2
    timeout 600; skip: a reason; with a semicolon
    """
    assert docs_check.parse_directives(body, "x.md:1") == [
        ("replace", "-np 4 => -np 2"),
        ("timeout", "600"),
        ("skip", "a reason; with a semicolon"),
    ]
    with pytest.raises(docs_check.DocError, match="unknown docs-check directive 'before'"):
        docs_check.parse_directives("before: import os", "x.md:1")
