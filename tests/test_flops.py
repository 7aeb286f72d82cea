"""FLOP formulas (pipeline/flops.py) on shapes computed by hand."""

import pytest

from pipeline.flops import op_flops, palm_flops_per_step


def test_matmul_family():
    assert op_flops("aten::mm", [[64, 128], [128, 32]], ["float", "float"]) == (2 * 64 * 128 * 32, "fp32")
    assert op_flops("aten::addmm", [[32], [64, 128], [128, 32], [], []], ["c10::BFloat16"] * 3) == (
        2 * 64 * 128 * 32,
        "bf16",
    )
    assert op_flops("aten::bmm", [[4, 8, 16], [4, 16, 2]], ["c10::Half"] * 2) == (2 * 4 * 8 * 16 * 2, "fp16")
    assert op_flops("aten::baddbmm", "[[4,8,2],[4,8,16],[4,16,2],[],[]]", '["float","float","float"]') == (
        2 * 4 * 8 * 16 * 2,
        "fp32",
    )
    assert op_flops("aten::mm", [[64, 128], [127, 32]], ["float"]) == (None, None)  # inner dims disagree
    assert op_flops("aten::linear", [[64, 128], [32, 128]], ["float"]) == (
        None,
        None,
    )  # counted via its addmm child
    assert op_flops("aten::mm", None, None) == (None, None)


def test_attention_forward_and_backward():
    q, k, v = [2, 8, 1024, 64], [2, 8, 2048, 64], [2, 8, 2048, 128]
    fwd = 2 * 2 * 8 * 1024 * 2048 * 64 + 2 * 2 * 8 * 1024 * 2048 * 128
    assert op_flops(
        "aten::_scaled_dot_product_flash_attention", [q, k, v, [], []], ["c10::BFloat16"] * 3
    ) == (fwd, "bf16")
    assert op_flops("aten::_scaled_dot_product_efficient_attention", [q, k, v, []], ["c10::Half"] * 3) == (
        fwd,
        "fp16",
    )
    g = [2, 8, 1024, 128]
    assert op_flops(
        "aten::_scaled_dot_product_flash_attention_backward", [g, q, k, v, g], ["c10::BFloat16"] * 5
    ) == (2.5 * fwd, "bf16")


def test_palm():
    # 1e9 params, 24 layers, 16 heads x 128, seq 2048, 8192 tokens: (6e9 + 12*24*16*128*2048) * 8192
    assert palm_flops_per_step(1e9, 24, 16, 128, 2048, 8192) == (6e9 + 12 * 24 * 16 * 128 * 2048) * 8192
    with pytest.raises(ValueError, match="layers"):
        palm_flops_per_step(1e9, 0, 16, 128, 2048, 8192)


def test_convolution_with_concrete_inputs():
    # tracelens mi300/resnet_act_checkpoint: aten::convolution Input Dims
    # [[10, 256, 14, 14], [512, 256, 3, 3], ...],
    # Concrete Inputs ['', '', '', '[2, 2]', '[1, 1]', '[1, 1]', 'False', '[0, 0]', '1']:
    # out = (14 + 2*1 - 1*(3-1) - 1) // 2 + 1 = 7 -> 2 * 10 * (512*256*3*3) * 7*7
    dims = [[10, 256, 14, 14], [512, 256, 3, 3], [], [], [], [], [], [], []]
    conc = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    assert op_flops("aten::convolution", dims, ["c10::BFloat16"] * 2, conc) == (
        2 * 10 * 512 * 256 * 9 * 49,
        "bf16",
    )
    assert op_flops("aten::convolution", dims, ["float"] * 2, None) == (
        None,
        None,
    )  # no stride/padding: not modelled
    # convolution_backward: grad_out [10, 512, 7, 7], weight [512, 512, 3, 3];
    # both grads: 2 x (2 * 10 * prod(w) * 49)
    bdims = [[10, 512, 7, 7], [10, 512, 7, 7], [512, 512, 3, 3], [], [], [], [], [], [], [], []]
    assert op_flops("aten::convolution_backward", bdims, ["float"] * 3) == (
        2 * 2 * 10 * 512 * 512 * 9 * 49,
        "fp32",
    )
    mask = ["", "", "", "[0]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[False, True, False]"]
    assert op_flops("aten::convolution_backward", bdims, ["float"] * 3, mask) == (
        2 * 10 * 512 * 512 * 9 * 49,
        "fp32",
    )
