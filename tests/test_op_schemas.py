"""The op arguments defined once (docs/design.md, "Options of an op") against what each flavor registered:
the native ops' schemas (csrc/rlkernels.cpp, through the generated headers), the Triton ops' schemas
(rlkernels/ops/*.py) and the Python tables; the committed generated headers against their generator; and
the per-row sums' columns of every kernel flavor against the ROW_STATS names."""

import pytest
import torch
from oracle import assert_oracle, cpu_kernel_backends
from policy_inputs import make_inputs

from rlkernels import cxx_headers
from rlkernels._op_schema import Signature, fields
from rlkernels.ops import policy_loss as policy_ops
from rlkernels.ops import value_loss as value_ops
from rlkernels.ops._aggregation import AggConfig
from rlkernels.ops._library import has_native
from rlkernels.policy_config import ROW_STATS, STAT_KEYS, PolicyConfig
from rlkernels.reference.kl import kl_penalty
from rlkernels.reference.policy_loss import LOG_RATIO_BOUND, log_ratio, policy_terms

BACKENDS = cpu_kernel_backends()
# Every op signature defined in Python, by native op name.
SIGNATURES = {
    s.name: s for s in (policy_ops.FORWARD, policy_ops.BACKWARD, value_ops.FORWARD, value_ops.BACKWARD)
}


def _arguments(schema) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments]


def _returns(schema) -> list[str]:
    return [str(r.type) for r in schema.returns]


def _triton_name(name: str) -> str:
    """policy_loss -> policy_loss_triton, policy_loss_backward -> policy_loss_triton_backward."""
    if name.endswith("_backward"):
        return name.removesuffix("_backward") + "_triton_backward"
    return name + "_triton"


def _expected(signature: Signature):
    return torch._C.parse_schema(f"rlkernels::{signature.name}{signature.schema()}")


@pytest.mark.parametrize("name", SIGNATURES)
def test_native_schema_is_the_python_signature(name):
    """The schema the extension registered (its option and aggregation fragments come from the generated
    headers) has the Python signature's names, types and order."""
    if not has_native(name):
        pytest.skip("the extension is not built")
    registered = getattr(torch.ops.rlkernels, name).default._schema
    want = _expected(SIGNATURES[name])
    assert _arguments(registered) == _arguments(want)
    assert _returns(registered) == _returns(want)


@pytest.mark.parametrize("name", SIGNATURES)
def test_triton_schema_is_the_python_signature(name):
    registered = getattr(torch.ops.rlkernels, _triton_name(name)).default._schema
    want = _expected(SIGNATURES[name])
    assert _arguments(registered) == _arguments(want)
    assert _returns(registered) == _returns(want)


@pytest.mark.parametrize(
    "name",
    ["linear_logprobs", "linear_logprobs_backward", "logprobs_from_logits", "logprobs_from_logits_backward"],
)
def test_logprobs_native_and_triton_schemas_agree(name):
    """The log-prob ops have no Signature yet: their native (csrc/rlkernels.cpp) and Triton
    (rlkernels/ops/logprobs.py) schemas must still be the same, names, types and order."""
    import rlkernels.ops.logprobs  # noqa: F401  (registers the Triton ops)

    if not has_native(name):
        pytest.skip("the extension is not built")
    native = getattr(torch.ops.rlkernels, name).default._schema
    triton = getattr(torch.ops.rlkernels, _triton_name(name)).default._schema
    assert _arguments(native) == _arguments(triton)
    assert _returns(native) == _returns(triton)


def _run(schema, group) -> list[tuple[str, str]]:
    """The arguments of `schema` from the first field of `group` on, as many as it has."""
    args = _arguments(schema)
    start = [n for n, _ in args].index(group._fields[0])
    return args[start : start + len(group._fields)]


@pytest.mark.parametrize(
    "name,group",
    [
        ("policy_loss", PolicyConfig),
        ("policy_loss_backward", PolicyConfig),
        ("policy_loss", AggConfig),
        ("value_loss", AggConfig),
        ("agg_loss", AggConfig),
    ],
)
def test_schemas_hold_the_table_in_order(name, group):
    """Each table's fields appear in the op's schema as one run, in the table's order and with the types of
    its annotations, in the native op (when built) and the Triton op alike."""
    want = [(f.name, str(torch._C.parse_schema(f"f({f.schema_type} x) -> ()").arguments[0].type))
            for f in fields(group)]  # fmt: skip
    ops = [_triton_name(name)] + ([name] if has_native(name) else [])
    for op in ops:
        assert _run(getattr(torch.ops.rlkernels, op).default._schema, group) == want, op


def test_generated_headers_are_fresh():
    """csrc/include/rlkernels/{policy_config,agg_config}.h are what `python -m rlkernels.cxx_headers`
    writes from the tables today."""
    stale = [str(p.relative_to(cxx_headers.ROOT)) for p in cxx_headers.stale()]
    assert not stale, f"stale generated headers {stale}: run python -m rlkernels.cxx_headers"


def test_generated_header_has_each_field_and_column():
    """The C++ struct lists PolicyConfig's fields in order, with the parsed member types, and RowStat the
    ROW_STATS columns at their positions."""
    text = cxx_headers.policy_config_header()
    start = text.index("struct PolicyLossConfig {")
    struct = text[start : text.index("};", start)]
    members = [line.split()[-1].rstrip(";") for line in struct.splitlines()[1:]]
    assert members == list(PolicyConfig._fields)
    assert "  PGObjective objective;" in struct and "  KLKind kl_kind;" in struct
    for i, name in enumerate(ROW_STATS):
        camel = "".join(part.capitalize() for part in name.split("_"))
        assert f"  k{camel} = {i},\n" in text
    assert f"  kRowStats = {len(ROW_STATS)},\n" in text


def test_signature_unpacks_by_name():
    args = tuple(range(len(policy_ops.FORWARD.fields)))
    inputs, config, agg, save_grad = policy_ops.FORWARD.unpack(args)
    assert inputs.logp == 0 and inputs.is_weights == 6
    assert config.objective == 7 and config.entropy_coef == 23
    assert agg.agg == 24 and agg.num_seqs_tensor == 30
    assert save_grad == 31
    assert tuple(inputs) + tuple(config) + tuple(agg) + (save_grad,) == args
    with pytest.raises(TypeError, match="expected 32 arguments, got 31"):
        policy_ops.FORWARD.unpack(args[:-1])


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_row_stat_columns_hold_what_their_names_say(backend, level):
    """Every flavor's per-row sums [B, len(ROW_STATS)], column by ROW_STATS name, against the reference
    (float64 inputs, so the kernels compute in float64)."""
    config = PolicyConfig(
        objective="clip", seq_level=level == "sequence", clip_low=0.2, clip_high=0.28, dual_clip=3.0,
        ratio_cap=None, tau_pos=1.0, tau_neg=1.05, dro_beta=1.0,
        vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0,
        kl_coef=0.1, kl_kind="k3", kl_clamp=10.0,
        entropy_coef=0.01,
    )  # fmt: skip
    x = make_inputs(4, 9, torch.float64, dict(dual_clip=3.0, level=level))
    inputs = policy_ops.PolicyInputs(
        x["logp"], x["old_logp"], x["advantages"], x["mask"], x["ref_logp"], x["entropy"], None
    )
    agg = AggConfig("token-mean", 1, 9.0, None, None, None, None)
    op = getattr(torch.ops.rlkernels, policy_ops._FLAVORS[backend])
    _loss, _stats, _weights, row_stats, _saved, _ok = op(*inputs, *config, *agg, False)
    assert tuple(row_stats.shape) == (4, len(ROW_STATS))

    m = inputs.mask.to(torch.float64)
    ratio = torch.exp(log_ratio(inputs.logp, inputs.old_logp, inputs.mask, level))
    _, flags = policy_terms(
        inputs.logp, inputs.old_logp, ratio, inputs.advantages.unsqueeze(-1), objective="clip", clip_low=0.2,
        clip_high=0.28, dual_clip=3.0, ratio_cap=None, tau_pos=1.0, tau_neg=1.05,
    )  # fmt: skip
    count = m.sum(-1)
    want = {
        "count": count,
        "seq_log_ratio": (
            (m * (inputs.logp - inputs.old_logp)).sum(-1) / count.clamp(min=1)
            if level == "sequence"
            else torch.zeros_like(count)
        ),
        **{key: (m * flags[key].to(m.dtype)).sum(-1) for key in STAT_KEYS[:4]},
        "approx_kl": (-m * (inputs.logp - inputs.old_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)).sum(-1),
        "kl": (m * kl_penalty(inputs.logp, inputs.ref_logp, "k3", 10.0)).sum(-1),
        "entropy": (m * inputs.entropy).sum(-1),
    }
    assert set(want) == set(ROW_STATS)
    for column, name in enumerate(ROW_STATS):
        assert_oracle(f"row_stats[:, {name}]", row_stats[:, column], None, want[name])
