"""Modelled device-memory traffic of framework ops from their recorded input shapes and dtypes
(Kineto `Input Dims` / `Input type`), for the roofline (queries/views/80_kernel_roofline.sql).

The model is compulsory traffic, as TraceLens's performance model counts it
(AMD-AGI/TraceLens TraceLens/PerfModel/perf_model.py, classes GEMM, CONV, SDPA,
UnaryElementwise, BinaryElementwise, Reduce, Normalization; ../shared/reference/peers.md 3.5):
every tensor input is read from device memory once and every output written once; caches,
re-reads and workspace are not counted, so the bytes are a lower bound and the achieved GB/s
derived from them never overstates what the kernel moved.

Bytes per op (|t| = elements of tensor t, b(t) = bytes per element of its dtype,
pipeline/catalog/dtypes.toml):
- mm / addmm / bmm / baddbmm / _scaled_mm: |A| b(A) + |B| b(B) + |bias| b(bias) + |C| b(C),
  C the m x n (x batch) output in A's dtype (_scaled_mm: fp8 inputs write bf16, 2 bytes).
- _scaled_dot_product_{flash,efficient,cudnn}_attention(q, k, v): q + k + v read, the
  output (b, h, s_q, d_v) written. Their *_backward(grad_out, q, k, v, out, ...): grad_out, q,
  k, v, out read; grad_q, grad_k, grad_v written (TraceLens flash_attention_backward).
- convolution(x, w, bias, ...): x + w + bias read, the output (n, c_out, *out spatial) written,
  out spatial from the stride/padding/dilation in Kineto's "Concrete Inputs" (pipeline/flops.py
  conv_out_spatial); not modelled without them or for a transposed convolution.
  convolution_backward(grad_out, x, w, ...): per gradient output_mask asks for (both without
  Concrete Inputs), its two operands read and the gradient written (TraceLens CONV.bytes_bwd):
  grad_input |g| + |w| + |x|, grad_weight |g| + |x| + |w|.
- elementwise ops (ELEMENTWISE below, by input arity ARITY): the tensors among the op's input
  arguments read, one output of their broadcast shape written (in-place ops write their first
  input: the same count); a tensor after the inputs is the out= tensor of a .out overload, and
  is the output written instead (never counted as read).
- copy_(dst, src): src read, dst written. fill_ / zero_: the tensor written.
- reductions (REDUCE): the input read; the output (at most the input's size, its shape depends
  on the dims argument, which is not recorded) is not counted.
- softmax, normalization and their backward (ROWWISE): every tensor input read, one tensor of
  the first input's shape written (the small per-row statistics and weight gradients are not).
- embedding(weight[V, D], indices): the indices read and |indices| x D rows read and written.

FLOPs used for the roofline: GEMMs, attention and convolution keep pipeline/flops.py's model
FLOPs (cpu_ops.flops, what MFU counts). The other ops here get `vector_flops`, one FLOP per
element of their largest tensor (TraceLens counts unary and binary elementwise ops so; it counts
softmax 3 and normalization about 5 per element). These ops sit two orders of magnitude left
of any GPU's ridge point (intensity well under 1 FLOP/byte against ~50-300), so the constant
never changes whether they are memory-bound; their fraction of the roof is measured against
bandwidth. vector_flops are not model FLOPs: MFU never counts them.

Dims entries that are not a non-empty list of non-negative ints, or whose type is not a Kineto
tensor element type (Scalar, Int, TensorList, an empty string), are not tensors. An op whose
tensors cannot be read, or that moves no bytes (an empty tensor), is not modelled (None), never
guessed.
"""

from __future__ import annotations

import json
import math
from math import prod

from .catalog import dtype_bytes
from .flops import conv_out_spatial, shape

GEMMS = {
    "aten::mm": (0, 1, None),
    "aten::_scaled_mm": (0, 1, None),
    "aten::addmm": (1, 2, 0),
    "aten::bmm": (0, 1, None),
    "aten::baddbmm": (1, 2, 0),
}
_SDPA = {f"aten::_scaled_dot_product_{k}_attention" for k in ("flash", "efficient", "cudnn")}
_SDPA_BWD = {f"{n}_backward" for n in _SDPA}
# elementwise ops by input arity: the leading positional arguments that are its inputs (ATen
# native_functions.yaml signatures); a tensor after them is the out= tensor of the .out overload
# (aten::clamp_min(self, min, out) is recorded as [[x], [], [out]]), written, not read
_ARITY = {
    1: "neg abs exp log sqrt rsqrt reciprocal relu gelu silu sigmoid tanh hardtanh leaky_relu elu "
    "clamp clamp_min clamp_max logical_not bitwise_not native_dropout clone",
    2: "add sub mul div pow threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward "
    "masked_fill maximum minimum eq ne lt gt le ge logical_and logical_or bitwise_and bitwise_or",
    3: "where addcmul addcdiv lerp",
}
ARITY = {f"aten::{n}": k for k, names in _ARITY.items() for base in names.split() for n in (base, base + "_")}
ELEMENTWISE = frozenset(ARITY)
_COPY = {"aten::copy_"}
_FILL = {"aten::fill_", "aten::zero_"}
REDUCE = frozenset(
    f"aten::{n}"
    for n in "sum mean amax amin max min norm linalg_vector_norm argmax argmin prod var std".split()
)
ROWWISE = frozenset(
    f"aten::{n}"
    for n in (
        "_softmax _log_softmax _softmax_backward_data _log_softmax_backward_data native_layer_norm "
        "native_layer_norm_backward native_batch_norm cudnn_batch_norm miopen_batch_norm "
        "native_batch_norm_backward cudnn_batch_norm_backward miopen_batch_norm_backward "
        "native_group_norm native_group_norm_backward _fused_rms_norm _fused_rms_norm_backward"
    ).split()
)
_EMBEDDING = {"aten::embedding"}
_CONV = {"aten::convolution"}
_CONV_BWD = {"aten::convolution_backward"}

MODELLED_OPS = frozenset(
    set(GEMMS)
    | _SDPA
    | _SDPA_BWD
    | ELEMENTWISE
    | _COPY
    | _FILL
    | REDUCE
    | ROWWISE
    | _EMBEDDING
    | _CONV
    | _CONV_BWD
)


def _tensors(dims, types) -> list[tuple[int, list[int], int] | None]:
    """Per input: (elements, shape, bytes per element) for a tensor input, else None. A tensor
    has a non-empty shape (pipeline/flops.py shape(); a 0-d tensor moves a few bytes and cannot be
    told from a Python number) and a Kineto tensor type: a C++ element type name ("float",
    "long int", "c10::BFloat16"); the capitalised names are the profiler's non-tensor argument
    kinds ("Scalar", "Int", "Double", "Bool", "TensorList")."""
    out = []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) else None
        tensor_type = isinstance(t, str) and (t[:1].islower() or t.startswith("c10::"))
        size = dtype_bytes(t) if tensor_type else None
        d = shape(d)
        out.append((prod(d), d, size) if size is not None and d else None)
    return out


def _broadcast(shapes: list[list[int]]) -> list[int] | None:
    """NumPy broadcasting of the shapes, or None when they do not broadcast."""
    n = max(len(s) for s in shapes)
    out = []
    for i in range(n):
        sizes = {s[len(s) - n + i] for s in shapes if len(s) - n + i >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return out


def _nbytes(t) -> int:
    return t[0] * t[2] if t is not None else 0


def _gemm(name, ts):
    ia, ib, ibias = GEMMS[name]
    a, b = ts[ia] if ia < len(ts) else None, ts[ib] if ib < len(ts) else None
    if a is None or b is None:
        return None
    sa, sb = a[1], b[1]
    if len(sa) == 2 and len(sb) == 2 and sa[1] == sb[0]:
        c = sa[0] * sb[1]
    elif len(sa) == 3 and len(sb) == 3 and sa[0] == sb[0] and sa[2] == sb[1]:
        c = sa[0] * sa[1] * sb[2]
    else:
        return None
    if min(*sa, *sb) == 0:  # an empty product does no work: nothing to model
        return None
    out_size = 2 if name == "aten::_scaled_mm" and a[2] == 1 else a[2]
    bias = ts[ibias] if ibias is not None and ibias < len(ts) else None
    return _nbytes(a) + _nbytes(b) + _nbytes(bias) + c * out_size


def _sdpa(ts, offset):
    q, k, v = (ts[offset + i] if offset + i < len(ts) else None for i in range(3))
    if q is None or k is None or v is None or len(q[1]) != 4 or len(v[1]) != 4:
        return None
    out = q[1][0] * q[1][1] * q[1][2] * v[1][3]
    if offset == 0:
        return _nbytes(q) + _nbytes(k) + _nbytes(v) + out * q[2]
    # backward: grad_out, q, k, v, out read; grad_q, grad_k, grad_v written
    return 2 * out * q[2] + 2 * (_nbytes(q) + _nbytes(k) + _nbytes(v))


def _conv(ts, concrete):
    if len(ts) < 2 or ts[0] is None or ts[1] is None:
        return None
    x, w = ts[0], ts[1]
    spatial = conv_out_spatial(x[1], w[1], concrete, allow_transposed=False)
    if spatial is None:
        return None
    bias = ts[2] if len(ts) > 2 else None
    return _nbytes(x) + _nbytes(w) + _nbytes(bias) + x[1][0] * w[1][0] * prod(spatial) * x[2]


def _conv_bwd(ts, concrete):
    if len(ts) < 3 or any(t is None for t in ts[:3]):
        return None
    g, x, w = ts[0], ts[1], ts[2]
    mask = None
    if concrete is not None and len(concrete) > 10:
        try:
            mask = json.loads(concrete[10].lower()) if isinstance(concrete[10], str) else None
        except ValueError:
            mask = None
    want = (mask if isinstance(mask, list) and len(mask) >= 2 else [True, True])[:2]
    per = _nbytes(g) + _nbytes(x) + _nbytes(w)
    return sum(1 for m in want if m) * per


def op_bytes(name: str, input_dims, input_types, concrete_inputs=None) -> tuple[float | None, float | None]:
    """(bytes moved, vector_flops) of one op by the module doc's model; (None, None) when the op
    or its tensors are not modelled. vector_flops is None for GEMMs, attention and convolution
    (their FLOPs are pipeline/flops.py's). input_dims / input_types / concrete_inputs: the parsed
    Kineto lists or their JSON text. Never raises on malformed shapes."""
    if name not in MODELLED_OPS or not input_dims:
        return None, None
    try:
        dims = json.loads(input_dims) if isinstance(input_dims, str) else input_dims
        types = json.loads(input_types) if isinstance(input_types, str) else (input_types or [])
        conc = json.loads(concrete_inputs) if isinstance(concrete_inputs, str) else concrete_inputs
        if not isinstance(dims, list) or not isinstance(types, list):
            return None, None
        ts = _tensors(dims, types)
        b, v = _model(name, ts, conc)
    except (IndexError, TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError, OverflowError):
        return None, None
    if b is None or not 0 < b < math.inf:  # empty tensors move nothing: nothing to model
        return None, None
    return b, v


def _model(name, ts, conc):
    present = [t for t in ts if t is not None]
    if name in GEMMS:
        v = _gemm(name, ts)
        return (float(v), None) if v is not None else (None, None)
    if name in _SDPA or name in _SDPA_BWD:
        v = _sdpa(ts, 0 if name in _SDPA else 1)
        return (float(v), None) if v is not None else (None, None)
    if name in _CONV:
        v = _conv(ts, conc)
        return (float(v), None) if v is not None else (None, None)
    if name in _CONV_BWD:
        v = _conv_bwd(ts, conc)
        return (float(v), None) if v is not None else (None, None)
    if not present:
        return None, None
    if name in _COPY:
        if len(ts) < 2 or ts[0] is None or ts[1] is None:
            return None, None
        return float(_nbytes(ts[0]) + _nbytes(ts[1])), float(ts[0][0])
    if name in _FILL:
        return float(_nbytes(present[0])), float(present[0][0])
    if name in _EMBEDDING:
        if len(ts) < 2 or ts[0] is None or ts[1] is None or len(ts[0][1]) != 2:
            return None, None
        rows = ts[1][0] * ts[0][1][1]
        return float(_nbytes(ts[1]) + 2 * rows * ts[0][2]), float(rows)
    read = sum(_nbytes(t) for t in present)
    if name in REDUCE:
        return float(read), float(max(t[0] for t in present))
    if name in ROWWISE:
        first = present[0]
        return float(read + _nbytes(first)), float(max(t[0] for t in present))
    # elementwise: the inputs are the tensors among the first ARITY arguments, the output their
    # broadcast in the first input's dtype (comparisons write bool, 1 byte), or the out= tensor
    ins = [t for t in ts[: ARITY[name]] if t is not None]
    outs = [t for t in ts[ARITY[name] :] if t is not None]
    if not ins:
        return None, None
    if outs:
        out_bytes, out = _nbytes(outs[0]), outs[0][0]
    else:
        bshape = _broadcast([t[1] for t in ins])
        if bshape is None:
            return None, None
        out = prod(bshape)
        out_bytes = out * (1 if name.split("::")[1].rstrip("_") in _BOOL_OUT else ins[0][2])
    return float(sum(_nbytes(t) for t in ins) + out_bytes), float(out)


_BOOL_OUT = {"eq", "ne", "lt", "gt", "le", "ge", "logical_and", "logical_or", "logical_not"}
