"""The plugin manager over the `cfm_plugins` entry points."""

import pytest

from cfm_plugins.config import Config
from cfm_plugins.manager import UnknownPluginError, available_plugins, create_manager


def test_builtin_plugins_are_installed_as_entry_points():
    plugins = available_plugins()
    assert {"binpack", "fused", "mace"} <= set(plugins)
    assert "bin-packing" in plugins["binpack"].summary


def test_unknown_plugin_names_the_known_ones():
    with pytest.raises(UnknownPluginError) as err:
        create_manager(Config(enabled=["binpak"], source="cli"))
    msg = str(err.value)
    assert "binpak" in msg and "binpack" in msg and "fused" in msg


def test_enabled_plugins_are_registered_and_validated():
    pm = create_manager(Config(enabled=["binpack"], options={"cost": "edges"}))
    assert pm.has_plugin("binpack") and not pm.has_plugin("fused")
    with pytest.raises(ValueError, match="cost='bytes'"):
        create_manager(Config(enabled=["binpack"], options={"cost": "bytes"}))


def test_single_process_distributed_default():
    pm = create_manager(Config(enabled=[]))
    dist = pm.hook.cfm_init_distributed(config=Config())
    assert (dist.rank, dist.world_size, dist.backend) == (0, 1, None)


# --- declared options, adapters, check_pending, config.pm
# ------------------------------------------


def test_every_installed_plugin_declares_its_options_once():
    from cfm_plugins.manager import catalog

    options = catalog().options()
    owners = {name: d.plugin for name, d in options.items()}
    assert owners["max_tokens"] == "binpack" and owners["fused_kernels"] == "fused"
    assert (
        owners["step_log"] == "core" and owners["collective_timeout"] == "core"
    )  # step_log: every adapter
    assert owners["rendezvous_interface"] == "core"
    assert all(d.option.help for d in options.values())


def test_the_adapter_serving_the_command_is_enabled():
    config = Config(
        enabled=["binpack", "fused"], trainer_argv=["/opt/bin/mace_run_train", "--name=x"]
    )
    pm = create_manager(config)
    assert config.enabled[0] == "mace" and pm.has_plugin("mace")
    assert config.pm is pm
    assert create_manager(Config(trainer_argv=["python", "-m", "mace.cli.run_train"])).has_plugin(
        "mace"
    )


def test_features_without_a_serving_adapter_are_refused_naming_the_installed_ones():
    from cfm_plugins.manager import MissingAdapterError

    with pytest.raises(
        MissingAdapterError,
        match=r"binpack work\(s\) through a trainer adapter"
        r".*installed adapters: hydragnn, mace, nequip",
    ):
        create_manager(Config(enabled=["binpack"], trainer_argv=["python", "train.py"]))
    # no features: a plain script under cfm-run is fine
    assert not create_manager(Config(trainer_argv=["python", "train.py"])).has_plugin("mace")


def test_a_hook_implementation_without_a_spec_is_refused_at_start():
    import pluggy

    from cfm_plugins.hookspec import hookimpl
    from cfm_plugins.manager import Catalog, catalog

    class Typo:
        @hookimpl
        def cfm_patch_modle(self, model, config):
            pass

    cat = catalog()
    cat.pm.register(Typo(), name="typo")
    cat.plugins["typo"] = cat.plugins["binpack"]
    with pytest.raises(pluggy.PluginValidationError, match="cfm_patch_modle"):
        create_manager(Config(enabled=["typo"]), cat)
    assert isinstance(cat, Catalog)


def test_unknown_option_is_refused_by_create_manager():
    with pytest.raises(ValueError, match="did you mean 'max_tokens'"):
        create_manager(Config(enabled=["binpack"], options={"max_token": "20"}))


def test_a_session_reaches_the_hooks_and_ranks_through_its_config():
    from cfm_plugins.manager import Session

    config = Config(enabled=["binpack"])
    pm = create_manager(config)
    config.dist = pm.hook.cfm_init_distributed(config=config)
    session = Session(config)
    assert (
        session.pm is pm
        and session.hook is pm.hook
        and session.dist is config.dist
        and session.train_sampler is None
    )


def test_fused_refuses_the_trainers_own_kernel_swaps_through_the_trainer_settings_hook():
    from cfm_plugins.options import TrainerSettings

    config = Config(enabled=["fused"])
    pm = create_manager(config)
    pm.hook.cfm_trainer_settings(
        config=config, trainer=TrainerSettings(batch_size=4, seed=1, dtype="float64")
    )
    with pytest.raises(ValueError, match="enable_cueq/enable_oeq replace the same modules"):
        pm.hook.cfm_trainer_settings(config=config, trainer=TrainerSettings(kernel_swaps=("cueq",)))


# --- options of plugins that are not enabled ------------------------------------------------------

MACE_ARGV = ["mace_run_train", "--name=x"]


def test_an_option_of_a_plugin_not_enabled_on_the_command_line_is_an_error_naming_the_plugin():
    """`--enable mace,binpack,fused -o static_shapes=true -o compile=default` trained eagerly and
    unpadded without a word: the static plugin that reads them was not enabled."""
    from cfm_plugins.config import build_config

    for options, trainer in (
        (["static_shapes=true", "compile=default"], []),
        ([], ["--cfm-compile=default"]),
    ):
        config = build_config("mace,binpack,fused", options, [*MACE_ARGV, *trainer], environ={})
        with pytest.raises(ValueError) as err:
            create_manager(config)
        msg = str(err.value)
        assert "read by the static plugin, which is not enabled" in msg, msg
        assert "--enable mace,binpack,fused,static" in msg and "compile='default'" in msg, msg
        assert ("cfm-run -o" if options else "--cfm-compile in the trainer command") in msg, msg


def test_an_option_of_a_plugin_not_enabled_from_the_environment_or_a_file_is_a_warning(tmp_path):
    from cfm_plugins.config import build_config

    config = build_config("mace,binpack", [], list(MACE_ARGV), environ={"CFM_COMPILE": "default"})
    create_manager(config)
    assert len(config.warnings) == 1 and (
        "compile='default' (from the environment (CFM_COMPILE)) is read by the static plugin, "
        "which is not enabled: enable it (--enable mace,binpack,static); this run ignores it"
        in config.warnings[0]
    ), config.warnings
    cfg = tmp_path / "train.yaml"
    cfg.write_text("name: x\ncfm_plugins:\n  enable: [mace, binpack, fused]\n  fused_tiles: ''\n")
    config = build_config("mace,binpack", [], [*MACE_ARGV, "--config", str(cfg)], environ={})
    create_manager(config)
    assert "read by the fused plugin, which is not enabled" in " ".join(config.warnings)
    # options of enabled plugins and of the core say nothing
    config = build_config(
        "mace,binpack", ["max_tokens=50", "collective_timeout=60"], list(MACE_ARGV), environ={}
    )
    create_manager(config)
    assert config.warnings == []
