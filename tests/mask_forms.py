"""A 0/1 mask in the three forms the token ops take (bool, an integer attention mask, float weights), and
the check that the calls given each agree bit for bit: the kernels weigh a kept token of a bool or integer
mask 1 without the product a float weight takes, which with a weight of 1.0 changes no bit."""

import torch


def zero_one_masks(mask: torch.Tensor, float_dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """`mask`'s kept tokens (nonzero) as a bool, an int64 and a float mask of 0 and 1."""
    keep = mask != 0
    return {"bool": keep, "int64": keep.to(torch.int64), "float": keep.to(float_dtype)}


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for k in sorted(x) for t in _tensors(x[k])]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    raise TypeError(f"not a tensor or a container of tensors: {type(x).__name__}")


def assert_same_bits(results: dict) -> None:
    """Every result (a tensor, or tuples, lists and dicts of them) equal to the first's, bit for bit."""
    (first_name, first), *others = results.items()
    want = _tensors(first)
    for name, result in others:
        got = _tensors(result)
        assert len(got) == len(want), (name, first_name)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.dtype == w.dtype and torch.equal(g, w), f"{name} differs from {first_name} at output {i}"
