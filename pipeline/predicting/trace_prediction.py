"""Predict any workload's allocator counters without running it on a GPU: trace, then replay.

The workload runs once, phase by phase as `own_model.py measure` runs it, under PyTorch's
FakeTensorMode (tensors with shapes and no memory) and a dispatch mode that sees every
operator: each new storage on the device is an allocation of its size in bytes, each storage
whose last reference goes (a weak reference that expires) is a free, in the order they
happen. `allocator_model.AllocatorModel` replays that sequence with the same phase boundaries
(baseline, peak reset, end values) and gives the six counters of every phase.

One thing a dispatch mode changes in PyTorch itself: while any is active, every tensor counts
as a subclass, and some of PyTorch's C++ then calls an operator out of place (a new storage)
where a real run calls its in-place form: the autograd engine adding a tensor's second
gradient to the first, the math attention kernel adding its mask to the scores, indexing's
backward writing into zeros (`IN_PLACE_IN_A_REAL_RUN`). The recorder finds those calls by
their C++ caller and records them as a real run makes them: the result shares its first
argument's block. And among free blocks of one size the allocator takes the lowest address,
which between segments is the driver's: each prediction is replayed under other orders of the
segments too, and where a counter moves it says "approximate", by how much (`predict`).

What no trace shows are the blocks a GPU kernel allocates inside one operator: cuBLAS and
cuBLASLt workspaces (kept, one set per thread that calls them), cuDNN convolution
workspaces, attention kernels' scratch, reductions' buffers. On a GPU, `probe_operators`
runs each distinct operator call of the trace once more, on fresh tensors, with the
allocator's history recorded, and keeps what it allocated besides its outputs: the
calibration. Without one, an operator not known to allocate only its outputs makes the
prediction "approximate", named; where the trace cannot follow the code (shapes that depend
on tensor values, an operator with no fake implementation) the prediction is "not
predicted", never a figure.

The code lives in the package `pipeline/predicting/trace/`, one module per part, each
importing only those before it: `model` (the trace), `operators` (what is known of operators
without a GPU), `calibration`, `gpu_paths` (what a GPU run does that a meta trace would not),
`recorder` (the dispatch mode), `tracer`, `replay`, `bounds` and `prediction`. This module
gives their names under the one name the rest of the project uses; a test that patches a
setting patches the module that reads it.

Standard library at module level: torch is imported by the functions that need it.
"""

from __future__ import annotations

from pipeline.core import torch_private
from pipeline.core.prediction_status import PEAK_KEYS, PredictionStatus
from pipeline.predicting.trace.bounds import (
    BOUNDS_METHOD,
    MATH_SCORES,
    SCRATCH_FACTOR,
    Scenario,
    boundable,
    bounds,
    not_covered,
    scratch_bound,
    uncertain_calls,
)
from pipeline.predicting.trace.calibration import (
    HISTORY_ENTRIES,
    Calibration,
    plain,
    probe,
    probe_operators,
    probe_workspace_threads,
    rebuild,
    segment_ranks,
    start_history,
    stop_history,
    template_entry,
    template_from_history,
    template_step,
)
from pipeline.predicting.trace.gpu_paths import (
    HOST_OUTPUTS,
    cudnn_takes_batch_norm,
    with_mode_inside,
)
from pipeline.predicting.trace.model import (
    AUTOGRAD,
    CALLER,
    OpCall,
    Signature,
    Trace,
    TraceStopped,
    packet,
    signature_id,
)
from pipeline.predicting.trace.operators import (
    BORROWED,
    COPIED_FIRST,
    CUMSUM,
    EMBEDDING,
    EMBEDDING_BACKWARD,
    FAST_PATH,
    FEW_INDICES,
    IN_PLACE_IN_A_REAL_RUN,
    META_CHOICES,
    OTHER_WAY,
    OUTPUT_ONLY,
    POW_SCALAR,
    SOFTMAX_BACKWARD,
    UNCALIBRATED,
    UNREADABLE_CALLER,
    UNSEEN,
    VALUE_DEPENDENT,
    by_source_template,
    call_arguments,
    cumsum_template,
    embedding_backward_template,
    output_only,
    reduction_without_scratch,
)
from pipeline.predicting.trace.prediction import (
    METHOD,
    OTHER_ADDRESS_ORDERS,
    Prediction,
    predict,
    prediction_record,
    prediction_rows,
    shuffled,
    side_by_side,
)
from pipeline.predicting.trace.recorder import cpp_caller, describe, make_flatten, make_recorder
from pipeline.predicting.trace.replay import (
    ADDRESS_ORDER,
    WORKSPACE_BOUND,
    DriverOrder,
    IndexedAllocator,
    RankedSegments,
    replay,
)
from pipeline.predicting.trace.tracer import Tracer, build_of, run_trace, trace_device

# fmt: off
__all__ = [  # every name above, which the rest of the project and its tests use
    "ADDRESS_ORDER", "AUTOGRAD", "BORROWED", "BOUNDS_METHOD", "CALLER", "COPIED_FIRST",
    "CUMSUM", "EMBEDDING", "EMBEDDING_BACKWARD", "FAST_PATH", "FEW_INDICES", "HISTORY_ENTRIES",
    "HOST_OUTPUTS", "IN_PLACE_IN_A_REAL_RUN", "MATH_SCORES", "META_CHOICES", "METHOD",
    "OTHER_ADDRESS_ORDERS", "OTHER_WAY", "OUTPUT_ONLY", "PEAK_KEYS", "POW_SCALAR",
    "SCRATCH_FACTOR", "SOFTMAX_BACKWARD", "UNCALIBRATED", "UNREADABLE_CALLER", "UNSEEN",
    "VALUE_DEPENDENT", "WORKSPACE_BOUND", "Calibration", "DriverOrder", "IndexedAllocator",
    "OpCall", "Prediction", "PredictionStatus", "RankedSegments", "Scenario", "Signature",
    "Trace", "TraceStopped", "Tracer", "boundable", "bounds", "build_of", "by_source_template",
    "call_arguments", "cpp_caller", "cudnn_takes_batch_norm", "cumsum_template", "describe",
    "embedding_backward_template", "make_flatten", "make_recorder", "not_covered",
    "output_only", "packet", "plain", "predict", "prediction_record", "prediction_rows",
    "probe", "probe_operators", "probe_workspace_threads", "rebuild",
    "reduction_without_scratch", "replay", "run_trace", "scratch_bound", "segment_ranks",
    "shuffled", "side_by_side", "signature_id", "start_history", "stop_history",
    "template_entry", "template_from_history", "template_step", "torch_private", "trace_device",
    "uncertain_calls", "with_mode_inside",
]
# fmt: on
