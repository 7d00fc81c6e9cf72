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
