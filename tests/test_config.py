"""The enable flag and options from the CLI, the environment and a trainer's config file."""

import pytest
import yaml

from cfm_plugins.config import build_config, pop_trainer_options, split_names


def test_split_names_keeps_order_and_drops_blanks():
    assert split_names(" Binpack, fused,,binpack ") == ["binpack", "fused"]
    assert split_names(["mace", "fused"]) == ["mace", "fused"]


def test_cli_beats_env_beats_file(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(
        yaml.safe_dump({"name": "x", "cfm_plugins": {"enable": ["fused"], "max_tokens": 100}})
    )
    argv = ["mace_run_train", "--config", str(cfg)]
    c = build_config("binpack", [], list(argv), environ={"CFM_PLUGINS": "mace"})
    assert c.enabled == ["binpack"] and c.source == "cli"
    c = build_config(None, [], list(argv), environ={"CFM_PLUGINS": "mace"})
    assert c.enabled == ["mace"] and c.source == "env"
    c = build_config(None, [], list(argv), environ={})
    assert c.enabled == ["fused"] and c.source == "config-file"
    assert c.get("max_tokens", type=int) == 100


def test_config_file_key_is_removed_from_the_copy_the_trainer_reads(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"name": "x", "batch_size": 4, "cfm_plugins": "binpack,fused"}))
    argv = ["mace_run_train", f"--config={cfg}", "--seed", "3"]
    c = build_config(None, [], argv, environ={})
    assert c.enabled == ["binpack", "fused"]
    new_path = argv[1].split("=", 1)[1]
    assert new_path != str(cfg)
    assert yaml.safe_load(open(new_path)) == {"name": "x", "batch_size": 4}
    assert "cfm_plugins" in yaml.safe_load(open(cfg))  # the user's file is untouched


def test_trainer_cfm_options_are_taken_out_of_the_trainer_command():
    argv = ["mace_run_train", "--cfm-max-tokens=512", "--name", "x", "--cfm_cost", "edges"]
    assert pop_trainer_options(argv) == {"max_tokens": "512", "cost": "edges"}
    assert argv == ["mace_run_train", "--name", "x"]
    with pytest.raises(ValueError, match="needs a value"):
        pop_trainer_options(["--cfm-max-tokens"])


def test_option_precedence_and_types():
    c = build_config(
        "binpack",
        ["max_tokens=64"],
        ["t", "--cfm-max-tokens=32"],
        environ={"CFM_MAX_TOKENS": "16", "CFM_COST": "edges"},
    )
    assert c.get("max-tokens", type=int) == 64
    assert c.get("cost") == "edges"
    with pytest.raises(ValueError, match="not a valid int"):
        build_config("binpack", ["max_tokens=lots"], []).get("max_tokens", type=int)


# --- declared options: unknown names, sources, conflicts (issue 12 items 4 and 5)
# ------------------


def _checked(config):
    from cfm_plugins.manager import catalog

    config.check_options(catalog().options())
    return config


@pytest.mark.parametrize(
    "make, where",
    [
        (
            lambda tmp: build_config(None, [], ["t", "--cfm-max-token=20"], environ={}),
            "--cfm-max-token in the trainer command",
        ),
        (
            lambda tmp: build_config(None, [], [], environ={"CFM_MAX_TOKEN": "20"}),
            "the environment (CFM_MAX_TOKEN)",
        ),
        (lambda tmp: build_config(None, ["max_token=20"], [], environ={}), "cfm-run -o"),
    ],
)
def test_a_misspelled_option_is_an_error_naming_value_source_and_closest_name(
    tmp_path, make, where
):
    with pytest.raises(ValueError) as err:
        _checked(make(tmp_path))
    msg = str(err.value)
    assert "unknown cfm-plugins option 'max_token'" in msg and "'20'" in msg and where in msg
    assert "did you mean 'max_tokens'? `cfm-run --list` shows every option." in msg  # no "?."


def test_a_misspelled_yaml_key_is_an_error_naming_the_file(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(
        yaml.safe_dump({"name": "x", "cfm_plugins": {"enable": ["binpack"], "overize": "skip"}})
    )
    with pytest.raises(ValueError) as err:
        _checked(build_config(None, [], ["t", "--config", str(cfg)], environ={}))
    msg = str(err.value)
    assert (
        "'overize'" in msg
        and "'skip'" in msg
        and str(cfg) in msg
        and "did you mean 'oversize'?" in msg
    )


def test_reserved_environment_names_are_not_options():
    env = {
        "CFM_PLUGINS": "binpack",
        "CFM_PLUGINS_CUDA": "1",
        "CFM_PLUGINS_FORCE_TORCH": "1",
        "CFM_LOG_LEVEL": "DEBUG",
        "CFM_MAX_TOKENS": "64",
    }
    c = _checked(build_config(None, [], [], environ=env))
    assert c.options == {"max_tokens": "64"} and c.get("max_tokens") == 64.0


def test_declared_defaults_and_types_live_once():
    c = _checked(build_config(None, ["cost_b=0.5"], [], environ={}))
    assert (
        c.get("cost") == "atoms" and c.get("cost_b") == 0.5 and c.get("collective_timeout") == 300.0
    )
    with pytest.raises(ValueError, match="oversize='never'.*expected one of error, skip, solo"):
        _checked(build_config(None, ["oversize=never"], [], environ={}))


def test_overrides_are_noted_with_both_sources(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(
        yaml.safe_dump({"cfm_plugins": {"enable": ["mace", "binpack"], "max_tokens": 100}})
    )
    c = build_config(
        "mace,fused",
        ["max_tokens=200"],
        ["t", "--config", str(cfg)],
        environ={"CFM_PLUGINS": ",,,"},
    )
    assert c.enabled == ["mace", "fused"] and c.source == "cli"
    notes = "\n".join(c.notes)
    assert "the environment (CFM_PLUGINS) is ',,,': it names no plugin" in notes
    assert "override the cfm_plugins: key of" in notes and "binpack not enabled" in notes
    assert (
        "option max_tokens='200' from cfm-run -o overrides 100 from the cfm_plugins: key of"
        in notes
    )


def test_empty_plugin_list_in_the_environment_falls_through_to_the_file(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"cfm_plugins": "binpack"}))
    c = build_config(None, [], ["t", "--config", str(cfg)], environ={"CFM_PLUGINS": ",,,"})
    assert c.enabled == ["binpack"] and c.source == "config-file"


def test_temporary_config_copies_are_removed():
    import tempfile
    from pathlib import Path

    from cfm_plugins.tempcopy import release

    folder = Path(tempfile.mkdtemp())
    cfg = folder / "train.yaml"
    cfg.write_text(yaml.safe_dump({"cfm_plugins": "binpack"}))
    argv = ["t", "--config", str(cfg)]
    build_config(None, [], argv, environ={})
    copy = Path(argv[2])
    assert copy.is_file() and copy.parent.parent.name.startswith("cfm_plugins_job_")
    release()
    assert not copy.parent.parent.exists()


@pytest.mark.parametrize(
    "form", ["mace --config YAML", "HydraGNN JSON", "nequip-train -cn NAME", "dashes"]
)
def test_a_misspelled_cfm_plugins_key_gets_a_did_you_mean_warning(tmp_path, form):
    """`cfm_plugin:` in the trainer's config trained without the plugins, rc 0, with no word."""
    import json

    data = {"NeuralNetwork": {}, "cfm_plugin": {"enable": ["binpack"]}}
    if form == "HydraGNN JSON":
        path = tmp_path / "config.json"
        path.write_text(json.dumps(data))
        argv = ["python", "train.py", str(path)]
    else:
        if form == "dashes":
            data = {"name": "x", "CFM-Plugins": ["binpack"]}
        path = tmp_path / "train.yaml"
        path.write_text(yaml.safe_dump(data))
        argv = (
            ["nequip-train", "-cp", str(tmp_path), "-cn", "train"]
            if form.startswith("nequip")
            else ["mace_run_train", "--config", str(path)]
        )
    c = build_config(None, [], list(argv), environ={})
    assert c.enabled == [] and len(c.warnings) == 1, c.warnings
    key = "CFM-Plugins" if form == "dashes" else "cfm_plugin"
    assert f"has no cfm_plugins: key but has '{key}': did you mean 'cfm_plugins'?" in c.warnings[0]
    assert str(path) in c.warnings[0]


def test_keys_not_close_to_cfm_plugins_say_nothing(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "plugins": 1, "cfm": 2, "model": "MACE"}))
    assert (
        build_config(None, [], ["mace_run_train", "--config", str(path)], environ={}).warnings == []
    )
