"""Bad inputs raise a clear TypeError/ValueError naming the argument (a table per public function)."""

import pytest
import torch

import rlkernels as rk

x = torch.zeros(4, 7)
BAD_INPUTS = [
    # (function, args, kwargs, exception, message fragment)
    (rk.kl_penalty, ([0.0] * 3, torch.zeros(3)), {}, TypeError, "logp must be a torch.Tensor"),
    (rk.kl_penalty, (torch.zeros(3, dtype=torch.int64), torch.zeros(3)), {}, TypeError, "logp must be float"),
    (
        rk.kl_penalty,
        (x, torch.zeros(4, 8)),
        {},
        ValueError,
        r"ref_logp has shape \(4, 8\) but logp has shape",
    ),
    (rk.kl_penalty, (x, x), {"kind": "k4"}, ValueError, "kind must be one of"),
    (rk.kl_penalty, (x, x), {"clamp": 0.0}, ValueError, "clamp must be > 0"),
    (rk.kl_penalty, (x, x), {"clamp": "10"}, TypeError, "clamp must be a number"),
    (rk.kl_penalty, (x, torch.zeros(4, 7, device="meta")), {}, ValueError, "on one device"),
    (rk.kl_penalty, (x, x), {"backend": "gpu"}, ValueError, "backend must be one of"),
]


@pytest.mark.parametrize(
    "fn,args,kwargs,exc,match", BAD_INPUTS, ids=[f"{c[0].__name__}-{c[4][:30]}" for c in BAD_INPUTS]
)
def test_bad_input_raises(fn, args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)
