"""rlkernels.memory.peak_bytes: what it measures on the CPU (a known allocation, freed or kept), and that it
refuses what it cannot measure instead of reading the wrong allocator."""

import pytest
import torch

from rlkernels.memory import peak_bytes

MIB = 2**20


def test_cpu_peak_counts_a_temporary_and_an_output():
    def temporary():  # 8 MiB allocated and freed inside the call, 4 bytes returned
        x = torch.ones(2 * MIB, dtype=torch.float32)
        return x.sum()

    def kept():  # 8 MiB returned: alive until the call returns
        return torch.ones(2 * MIB, dtype=torch.float32)

    for fn in (temporary, kept):
        peak = peak_bytes(fn, "cpu")
        assert 8 * MIB <= peak < 9 * MIB, (fn.__name__, peak)
    assert peak_bytes(lambda: None, torch.device("cpu")) < MIB


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="peak_bytes: fn must be a callable"):
        peak_bytes(torch.ones(3), "cpu")
    with pytest.raises(TypeError, match="device"):
        peak_bytes(lambda: None)  # the device is not guessed
    with pytest.raises(ValueError, match="peak_bytes: device must be 'cpu' or 'cuda'.*got meta"):
        peak_bytes(lambda: None, "meta")
    with pytest.raises(ValueError, match="peak_bytes: device must be 'cpu' or 'cuda', got 'gpu0'"):
        peak_bytes(lambda: None, "gpu0")
