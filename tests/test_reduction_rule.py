"""Which traced reductions the trace trusts to allocate their outputs only
(trace_prediction.reduction_without_scratch), on calls traced on the meta device: the
RMSNorm statistic of the decoder workload (a float32 vector norm of a bfloat16 or float16
input) and 16-bit sums and means asked for float32 are reduced uncast on CUDA; a norm over
dimensions all of size 1 is a copy, and so is any other change of dtype."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeline.predicting import trace_prediction as tp  # noqa: E402


def traced(name: str, make):
    """The signature of the one `name` call `make()` makes on the meta device."""

    def drive(phase):
        phase("step", make)

    trace = tp.run_trace(torch, "meta", drive)
    (found,) = [s for s in trace.signatures.values() if s.name == name]
    return found


NORM = "aten.linalg_vector_norm.default"


def norm(shape, dtype, asked=None, dim=-1, rows=None):
    def make():
        x = torch.empty(shape, device="meta", dtype=dtype)
        if rows is not None:
            x = x[:, rows]
        return torch.linalg.vector_norm(x, dim=dim, keepdim=True, dtype=asked)

    return traced(NORM, make)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_float32_norm_of_a_16_bit_hidden_state_allocates_its_output_only(dtype):
    assert tp.output_only(norm((4, 16, 4096), dtype, torch.float32))


@pytest.mark.parametrize(
    ("shape", "dtype", "asked", "why"),
    [
        ((4, 16, 8192), torch.bfloat16, torch.float32, "8,192 inputs an output: may split"),
        ((4, 16, 1), torch.bfloat16, torch.float32, "size-1 dimension: self.to(dtype), a copy"),
        ((4, 16, 4096), torch.float32, torch.float64, "cast first: a copy"),
        ((4, 16, 4096), torch.float16, torch.float64, "cast first: a copy"),
    ],
)
def test_a_norm_that_may_take_scratch_or_a_copy_is_not_trusted(shape, dtype, asked, why):
    assert not tp.output_only(norm(shape, dtype, asked)), why


def test_a_norm_without_dtype_or_in_its_own_dtype_is_trusted():
    assert tp.output_only(norm((4, 16, 4096), torch.bfloat16))
    assert tp.output_only(norm((4, 16, 4096), torch.float32, torch.float32))
    assert tp.output_only(norm((4, 16, 1), torch.bfloat16))  # abs into the output


@pytest.mark.parametrize(
    ("name", "reduce"),
    [
        ("aten.sum.dim_IntList", lambda x, dtype: x.sum(-1, dtype=dtype)),
        ("aten.mean.dim", lambda x, dtype: x.mean(-1, dtype=dtype)),
    ],
)
def test_16_bit_sums_and_means_asked_for_float32_are_reduced_uncast(name, reduce):
    x = torch.empty(8, 1024, device="meta", dtype=torch.bfloat16)
    assert tp.output_only(traced(name, lambda: reduce(x, torch.float32)))
    assert not tp.output_only(traced(name, lambda: reduce(x, torch.float64)))
    wide = torch.empty(8, 1024, device="meta", dtype=torch.float32)
    assert not tp.output_only(traced(name, lambda: reduce(wide, torch.float64)))


@pytest.mark.parametrize(
    ("dtype", "trusted"),
    [(torch.bool, False), (torch.int32, False), (torch.uint8, False), (torch.int64, True)],
    ids=str,
)
def test_a_small_integer_or_bool_sum_is_copied_as_int64_first(dtype, trusted):
    """`mask.sum()` of 64 values: sum_out casts an integer or bool input to the int64 result
    (make_reduction_from_out_ty), a copy an H100's allocator history showed inside the call
    (cross_entropy's label smoothing counts its targets so)."""

    def make():
        return torch.zeros(64, device="meta", dtype=dtype).sum()

    assert tp.output_only(traced("aten.sum.default", make)) is trusted
