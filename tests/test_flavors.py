"""The test flavors themselves (tests/oracle.py): what each flavor is, and the guard that keeps a test's
data draws from depending on the flavor's device."""

import pytest
import torch
from oracle import FLAVOR_KINDS, Flavor, drawn_on_cpu, kernel_flavors


def test_every_flavor_has_a_kind():
    for flavor in kernel_flavors():
        assert flavor.kind in ("native-cpu", "native-cuda", "triton")
    assert FLAVOR_KINDS["cuda-on-cpu"] == FLAVOR_KINDS["cuda"] == "native-cuda"
    assert FLAVOR_KINDS["triton-interpret"] == FLAVOR_KINDS["triton"] == "triton"


@pytest.mark.parametrize("factory", [torch.randn, torch.rand, torch.randperm])
def test_a_cpu_generator_without_a_device_raises_inside_a_flavor(factory):
    """The H200 run: inside a GPU flavor, torch.randn(..., generator=<CPU generator>) lands on CUDA and
    raises there. The guard makes it raise on every flavor, the CPU ones included."""
    gen = torch.Generator().manual_seed(0)
    with Flavor("cpu", "cpu").activate():
        with pytest.raises(AssertionError, match="without device= inside a test flavor"):
            factory(5, generator=gen)
        assert factory(5, generator=gen, device="cpu").device.type == "cpu"  # said explicitly: fine
        assert factory(5).device.type == "cpu"  # no generator: the flavor's device, as intended
    assert factory(5, generator=gen).device.type == "cpu"  # outside a flavor: torch's rules


def test_drawn_on_cpu_gives_the_same_values_on_the_flavors_device():
    @drawn_on_cpu
    def helper(seed):
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(3, generator=gen), {"ids": torch.arange(4)}

    with torch.device("meta"):  # stands for a GPU flavor's device: the results move there
        x, d = helper(1)
    assert x.device.type == "meta" and d["ids"].device.type == "meta"
    with Flavor("cpu", "cpu").activate():
        y, _ = helper(1)
    torch.testing.assert_close(y, torch.randn(3, generator=torch.Generator().manual_seed(1)))
