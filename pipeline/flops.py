"""Model FLOPs of framework ops from their recorded input shapes (Kineto `Input Dims`).

Formulas (multiply-add = 2 FLOPs), following PyTorch's FlopCounterMode registry
(torch/utils/flop_counter.py; ../shared/reference/peers.md section 3.5):
- aten::mm(a[m,k], b[k,n])                 2*m*n*k
- aten::addmm(bias, a[m,k], b[k,n])        2*m*n*k (bias ignored)
- aten::bmm(a[b,m,k], b[b,k,n])            2*b*m*n*k
- aten::baddbmm(bias, a[b,m,k], b[b,k,n])  2*b*m*n*k
- aten::_scaled_mm(a[m,k], b[k,n], ...)    2*m*n*k
- aten::_scaled_dot_product_{flash,efficient,cudnn}_attention(q[b,h,s_q,d], k[b,h,s_k,d], v[b,h,s_k,d_v], ...)
                                           2*b*h*s_q*s_k*d + 2*b*h*s_q*s_k*d_v (QK^T and PV)
- their *_backward(grad_out, q, k, v, ...)  2.5 x the forward (recompute QK^T, dV, dP, dQ, dK:
                                           5 matmul-equivalents), FlopCounterMode's sdpa_backward
Causal masking is not discounted (FlopCounterMode, PaLM and torchtitan count the full square),
so a causal model's attention FLOPs are counted as if dense.
- aten::convolution(x[n,c_in,*s], w[c_out,c_in/g,*k], bias, stride, padding, dilation,
  transposed, output_padding, groups)      2*n*prod(w)*prod(out spatial), out spatial from the
                                           stride/padding/dilation in Kineto's "Concrete Inputs"
                                           (transposed: the input's spatial size); without them
                                           the op is not modelled
- aten::convolution_backward(grad_out[n,c_out,*o], x, w, ..., output_mask)
                                           2*n*prod(w)*prod(o) for each of grad_input and
                                           grad_weight that output_mask asks for (both when the
                                           trace has no Concrete Inputs)
Ops that call these (aten::linear, aten::matmul, aten::scaled_dot_product_attention,
aten::conv2d) are not counted themselves, so nothing is counted twice. A trace's own `flops` arg
(with_flops=True) wins.

The dtype of the first tensor input picks the peak to compare with: float -> fp32,
c10::Half -> fp16, c10::BFloat16 -> bf16, Float8 -> fp8.
"""

from __future__ import annotations

import json
import math
from math import prod

_DTYPES = {
    "float": "fp32",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
}


def shape(d) -> list[int] | None:
    """A tensor shape from an Input Dims entry: a list of non-negative ints (not bools), else
    None (a scalar's [] stays []; nested lists, strings, negative sizes are no shape)."""
    if isinstance(d, list) and all(type(v) is int and v >= 0 for v in d):
        return d
    return None


def _mm(a, b):
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return 2 * a[0] * a[1] * b[1]
    return None


def _bmm(a, b):
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return 2 * a[0] * a[1] * a[2] * b[2]
    return None


def _literal(text):
    """A Concrete Inputs entry ('[2, 2]', 'False', '1') as a Python value, or None."""
    import ast

    try:
        return ast.literal_eval(text) if text not in ("", None) else None
    except (ValueError, SyntaxError):
        return None


def conv_out_spatial(x, w, concrete, allow_transposed: bool = True) -> list[int] | None:
    """Output spatial size of aten::convolution(x, w, bias, stride, padding, dilation, transposed,
    ...) from the input and weight shapes and Kineto's "Concrete Inputs" (standard formula,
    torch.nn.Conv2d docs); a transposed convolution gives the input's spatial size (the FLOP
    model's convention above), or None when allow_transposed is False. None without the
    Concrete Inputs or for shapes that do not fit."""
    if concrete is None or len(concrete) < 9 or not isinstance(x, list) or not isinstance(w, list):
        return None
    stride, padding, dilation, transposed = (_literal(concrete[i]) for i in (3, 4, 5, 6))
    if len(x) < 3 or len(w) != len(x):
        return None
    spatial_in, kernel = x[2:], w[2:]
    if transposed:
        return list(spatial_in) if allow_transposed else None
    if not all(isinstance(v, list) and len(v) == len(kernel) for v in (stride, padding, dilation)):
        return None
    if (
        not all(type(v) is int for v in (*stride, *padding, *dilation))
        or min((*stride, *dilation), default=1) < 1
        or min(padding, default=0) < 0
    ):
        return None
    out = [
        (s + 2 * p - dl * (k - 1) - 1) // st + 1
        for s, p, dl, k, st in zip(spatial_in, padding, dilation, kernel, stride)
    ]
    return out if all(o > 0 for o in out) else None  # a kernel larger than its padded input


def _conv(d, concrete):
    if len(d) < 2:
        return None
    out = conv_out_spatial(d[0], d[1], concrete)
    return None if out is None else 2 * d[0][0] * prod(d[1]) * prod(out)


def _conv_bwd(d, concrete):
    if len(d) < 3 or len(d[0]) < 3 or len(d[2]) != len(d[0]):
        return None
    g, w = d[0], d[2]
    mask = _literal(concrete[10]) if concrete is not None and len(concrete) > 10 else None
    n_grads = sum(1 for m in (mask or [True, True])[:2] if m)
    return n_grads * 2 * g[0] * prod(w) * prod(g[2:])


def _sdpa(q, k, v):
    if (
        len(q) == 4
        and len(k) == 4
        and len(v) == 4
        and q[:2] == k[:2] == v[:2]
        and q[3] == k[3]
        and k[2] == v[2]
    ):
        b, h, s_q, d = q
        return 2 * b * h * s_q * k[2] * d + 2 * b * h * s_q * k[2] * v[3]
    return None


def _sdpa_bwd(q, k, v):
    f = _sdpa(q, k, v)
    return None if f is None else 2.5 * f


_FORMULAS = {
    "aten::mm": lambda d: _mm(d[0], d[1]),
    "aten::_scaled_mm": lambda d: _mm(d[0], d[1]),
    "aten::addmm": lambda d: _mm(d[1], d[2]),
    "aten::bmm": lambda d: _bmm(d[0], d[1]),
    "aten::baddbmm": lambda d: _bmm(d[1], d[2]),
    **{
        f"aten::_scaled_dot_product_{k}_attention": (lambda d: _sdpa(d[0], d[1], d[2]))
        for k in ("flash", "efficient", "cudnn")
    },
    **{
        f"aten::_scaled_dot_product_{k}_attention_backward": (lambda d: _sdpa_bwd(d[1], d[2], d[3]))
        for k in ("flash", "efficient", "cudnn")
    },
}
_WITH_CONCRETE = {"aten::convolution": _conv, "aten::convolution_backward": _conv_bwd}

MODELLED_OPS = frozenset(_FORMULAS) | frozenset(_WITH_CONCRETE)


def op_flops(name: str, input_dims, input_types, concrete_inputs=None) -> tuple[float | None, str | None]:
    """FLOPs and precision of one op, or (None, None) when the op or its shapes are not modelled.

    input_dims / input_types / concrete_inputs: the parsed Kineto lists (or JSON text of them).
    """
    f = _FORMULAS.get(name)
    fc = _WITH_CONCRETE.get(name)
    if (f is None and fc is None) or not input_dims:
        return None, None
    try:
        dims = json.loads(input_dims) if isinstance(input_dims, str) else input_dims
        if not isinstance(dims, list):
            return None, None
        dims = [shape(d) for d in dims]  # an entry that is not a shape cannot feed a formula
        if fc is not None:
            conc = json.loads(concrete_inputs) if isinstance(concrete_inputs, str) else concrete_inputs
            v = fc(dims, conc)
        else:
            v = f(dims)
        v = None if v is None else float(v)
    except (IndexError, TypeError, ValueError, KeyError, ZeroDivisionError, OverflowError):
        return None, None
    if v is None or not 0 < v < math.inf:  # no work (an empty tensor) is nothing to model
        return None, None
    dtype = None
    try:
        types = json.loads(input_types) if isinstance(input_types, str) else (input_types or [])
        for t in types:
            if t in _DTYPES:
                dtype = _DTYPES[t]
                break
    except (TypeError, ValueError):
        pass
    return float(v), dtype


def palm_flops_per_token(params: float, layers: int, heads: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) by PaLM's formula (Chowdhery et al. 2022,
    arXiv 2204.02311, appendix B): 6N + 12*L*H*Q*T, N = parameters in matmuls, L layers, H heads,
    Q head dim, T sequence length. Raises ValueError for inputs that are not positive and finite."""
    vals = dict(params=params, layers=layers, heads=heads, head_dim=head_dim, seq_len=seq_len)
    missing = [k for k, v in vals.items() if v is None]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    bad = [k for k, v in vals.items() if not 0 < v < math.inf]
    if bad:
        raise ValueError(f"PaLM FLOPs need positive finite values for: {', '.join(bad)}")
    return 6 * params + 12 * layers * heads * head_dim * seq_len


def palm_flops_per_step(
    params: float, layers: int, heads: int, head_dim: int, seq_len: int, tokens_per_step: float
) -> float:
    """Model FLOPs of one training step (forward + backward) from the model's shape, PaLM's
    formula (Chowdhery et al. 2022, arXiv 2204.02311, appendix B): per token 6N + 12*L*H*Q*T,
    N = parameters in matmuls, L layers, H heads, Q head dim, T sequence length; times the tokens
    this rank processes per step. Causal masking is not discounted (PaLM, torchtitan, nanoGPT).
    Raises ValueError for non-positive inputs."""
    vals = dict(
        params=params,
        layers=layers,
        heads=heads,
        head_dim=head_dim,
        seq_len=seq_len,
        tokens_per_step=tokens_per_step,
    )
    bad = [k for k, v in vals.items() if not v or v <= 0]
    if bad:
        raise ValueError(f"PaLM FLOPs need positive values for: {', '.join(bad)}")
    return (6 * params + 12 * layers * heads * head_dim * seq_len) * tokens_per_step
