"""The `cfm_plugins:` key in a Hydra trainer's config (nequip-train -cn NAME [-cp DIR]); no nequip
needed."""

from __future__ import annotations

from pathlib import Path

import yaml

from cfm_plugins.config import build_config, find_hydra_config


def _write(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_text(
        yaml.safe_dump(
            {
                "cfm_plugins": {"enable": ["nequip", "binpack"], "max_tokens": 64},
                "run": ["train"],
                "trainer": {"max_epochs": 1},
            }
        )
    )
    return path


def test_hydra_config_key_enables_and_is_stripped(tmp_path):
    _write(tmp_path, "tiny.yaml")
    argv = ["nequip-train", "-cp", str(tmp_path), "-cn", "tiny", "hydra.run.dir=out"]
    cfg = build_config(None, (), trainer_argv=argv, environ={})
    assert cfg.enabled == ["nequip", "binpack"] and cfg.source == "config-file"
    assert cfg.get("max_tokens", type=int) == 64
    copy = find_hydra_config(argv)
    assert copy is not None and copy.parent != tmp_path and copy.is_file()
    assert argv[0] == "nequip-train" and argv[-1] == "hydra.run.dir=out"
    data = yaml.safe_load(copy.read_text())
    assert "cfm_plugins" not in data and data["trainer"] == {"max_epochs": 1}
    assert "cfm_plugins" in yaml.safe_load(
        (tmp_path / "tiny.yaml").read_text()
    )  # the user's file is untouched


def test_hydra_equals_form_and_default_config_path(tmp_path, monkeypatch):
    _write(tmp_path, "tiny.yaml")
    monkeypatch.chdir(tmp_path)
    argv = ["nequip-train", "--config-name=tiny.yaml"]
    cfg = build_config(None, (), trainer_argv=argv, environ={})
    assert cfg.enabled == ["nequip", "binpack"]
    assert argv[1].startswith("--config-name=") and "-cp" in argv  # the copy's folder is named
    assert find_hydra_config(argv).parent != tmp_path


def test_cli_flag_wins_and_no_hydra_config_is_fine(tmp_path):
    _write(tmp_path, "tiny.yaml")
    argv = ["nequip-train", "-cp", str(tmp_path), "-cn", "tiny"]
    assert build_config("nequip", (), trainer_argv=argv, environ={}).enabled == ["nequip"]
    assert (
        build_config(None, (), trainer_argv=["nequip-train", "-cn", "missing"], environ={}).enabled
        == []
    )


def test_enabling_nequip_without_nequip_installed_is_a_clear_error():
    import importlib.util

    import pytest

    from cfm_plugins.config import Config
    from cfm_plugins.manager import create_manager

    if importlib.util.find_spec("nequip") is not None:
        create_manager(Config(enabled=["nequip"], source="cli"))  # nequip present: accepted
        return
    with pytest.raises(ValueError, match=r"pip install 'cfm-plugins\[nequip\]'"):
        create_manager(Config(enabled=["nequip"], source="cli"))
