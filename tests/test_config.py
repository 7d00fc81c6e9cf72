"""The enable flag and options from the CLI, the environment and a trainer's config file."""
import pytest
import yaml

from cfm_plugins.config import build_config, pop_trainer_options, split_names


def test_split_names_keeps_order_and_drops_blanks():
    assert split_names(" Binpack, fused,,binpack ") == ["binpack", "fused"]
    assert split_names(["mace", "fused"]) == ["mace", "fused"]


def test_cli_beats_env_beats_file(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"name": "x", "cfm_plugins": {"enable": ["fused"], "max_tokens": 100}}))
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
    c = build_config("binpack", ["max_tokens=64"], ["t", "--cfm-max-tokens=32"],
                     environ={"CFM_MAX_TOKENS": "16", "CFM_COST": "edges"})
    assert c.get("max-tokens", type=int) == 64
    assert c.get("cost") == "edges"
    with pytest.raises(ValueError, match="not a valid int"):
        build_config("binpack", ["max_tokens=lots"], []).get("max_tokens", type=int)
