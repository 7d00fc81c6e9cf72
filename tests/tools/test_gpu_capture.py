"""tools/gpu_capture.py: the sync check (the GPU's warnings raised by hand: no GPU here)."""

from __future__ import annotations


def test_the_sync_check_lists_every_synchronizing_call_with_its_stack(monkeypatch, capsys):
    """gpu_capture.sync_check on a GPU: torch warns at each synchronizing call ("warn" mode); the
    check counts them and prints each distinct call's stack, not torch's one-time notice that the
    mode is a prototype (an H100 run counted it as a sync). The GPU's warning is raised here by
    hand (torch.cuda's mode switch and synchronize are stood in for: no GPU here)."""
    import types
    import warnings

    import torch

    from tools import gpu_capture

    modes = []

    def set_mode(mode):  # torch's first switch in a process warns once that the mode is a prototype
        if not modes:
            warnings.warn(
                "Synchronization debug mode is a prototype feature and does not yet detect all "
                "synchronizing operations",
                stacklevel=1,
            )
        modes.append(mode)

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    cuda = types.SimpleNamespace(type="cuda")

    def waits_for_the_device():
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)

    def step():
        waits_for_the_device()
        waits_for_the_device()
        warnings.warn(
            "something else", stacklevel=1
        )  # not a sync: not counted, nor the prototype notice

    result = gpu_capture.sync_check(cuda, step)
    assert (
        result.startswith("FAIL: 2 synchronizing call(s), the first at")
        and "test_gpu_capture.py" in result
    )
    assert modes == ["warn", 0]
    out = capsys.readouterr().out
    assert (
        out.count("its stack:") == 2 and "waits_for_the_device" in out
    )  # two lines: two distinct stacks
    assert gpu_capture.sync_check(cuda, lambda: None) == "PASS" and modes[-2:] == ["warn", 0]
