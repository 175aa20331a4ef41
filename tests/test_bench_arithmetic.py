"""The arithmetic floor (leakgym.bench.arithmetic): counted operations against independent formulas."""

import math

import pytest
import torch
import torch.nn.functional as F

from leakgym.bench.arithmetic import count_matrix_flops, gemm_rate


def test_matrix_products_are_two_operations_per_multiply_add():
    a, b = torch.randn(3, 5, 7), torch.randn(3, 7, 2)
    with count_matrix_flops() as flops:
        torch.bmm(a, b)
        torch.randn(4, 6) @ torch.randn(6, 9)
    assert flops.total == 2 * 3 * 5 * 7 * 2 + 2 * 4 * 6 * 9
    assert flops.by_operator() == {"bmm": 2 * 3 * 5 * 7 * 2, "mm": 2 * 4 * 6 * 9}


def _conv_ops(batch, out_positions, out_ch, in_ch_per_group, kernel):
    return 2 * batch * out_positions * out_ch * in_ch_per_group * kernel


@pytest.mark.parametrize("groups", [1, 3, 12])
def test_a_convolution_and_both_gradients_count_three_forwards_grouped_or_not(groups):
    """torch's own formula counts a grouped convolution's weight gradient `groups` times over: with it this
    test fails for groups 3 and 12."""
    x = torch.randn(2, 12, 9, 9, requires_grad=True)
    w = torch.randn(24, 12 // groups, 3, 3, requires_grad=True)
    with count_matrix_flops() as flops:
        y = F.conv2d(x, w, stride=2, padding=1, groups=groups)
        y.square().sum().backward()
    forward = _conv_ops(2, 5 * 5, 24, 12 // groups, 9)
    assert tuple(y.shape) == (2, 24, 5, 5)
    assert flops.by_operator() == {"convolution": forward, "convolution_backward": 2 * forward}


def test_a_grouped_convolution_counts_what_its_groups_count_one_by_one():
    """The same arithmetic written as one ungrouped convolution per group gives the same count."""
    x, w = torch.randn(2, 6, 8, 8, requires_grad=True), torch.randn(9, 2, 3, 3, requires_grad=True)
    with count_matrix_flops() as grouped:
        F.conv2d(x, w, padding=1, groups=3).sum().backward()
    with count_matrix_flops() as one_by_one:
        for g in range(3):
            F.conv2d(x[:, 2 * g:2 * g + 2], w[3 * g:3 * g + 3], padding=1).sum().backward()
    assert grouped.total == one_by_one.total > 0


def test_a_transposed_convolution_counts_its_input_positions():
    x = torch.randn(2, 6, 4, 4, requires_grad=True)
    w = torch.randn(6, 4, 3, 3, requires_grad=True)  # (in, out / groups, kh, kw), groups 2: 8 outputs
    with count_matrix_flops() as flops:
        F.conv_transpose2d(x, w, stride=2, groups=2).sum().backward()
    forward = 2 * 2 * 16 * 6 * 4 * 9  # every input position meets each of its group's 4 output channels' kernels
    assert flops.by_operator() == {"convolution": forward, "convolution_backward": 2 * forward}


def test_only_the_requested_gradients_are_counted():
    x, w = torch.randn(1, 4, 6, 6), torch.randn(8, 4, 3, 3, requires_grad=True)  # no input gradient
    with count_matrix_flops() as flops:
        F.conv2d(x, w).sum().backward()
    forward = _conv_ops(1, 16, 8, 4, 9)
    assert flops.by_operator() == {"convolution": forward, "convolution_backward": forward}


def test_a_module_fed_a_leaf_inside_autograd_grad_is_counted():
    """Found with `leakgym bench env --defender random` on SVHN: DCS²'s reference synthesis passes its concealed
    samples (a leaf) through the model and differentiates with torch.autograd.grad, where the module tracker of
    torch's FlopCounterMode raised ("A leaf node was passed to _will_engine_execute_node") and the counted step
    failed. Counted without it: the forward and both gradients, as for a bare convolution."""
    conv = torch.nn.Conv2d(3, 4, 3)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    with count_matrix_flops() as flops:
        (g,) = torch.autograd.grad(conv(x).square().sum(), [x], create_graph=True)
        torch.autograd.grad(g.sum(), [conv.weight])
    assert flops.total > 3 * _conv_ops(2, 16, 4, 3, 9)


def test_gemm_rate_is_a_finite_positive_rate_and_checks_its_arguments():
    rate = gemm_rate("cpu", size=64, repeats=3)
    assert math.isfinite(rate) and rate > 0
    with pytest.raises(ValueError, match="size=0"):
        gemm_rate("cpu", size=0)
    with pytest.raises(ValueError, match="repeats=0"):
        gemm_rate("cpu", repeats=0)


@pytest.mark.cuda
def test_counting_and_the_gemm_rate_on_cuda(cuda_device):
    x = torch.randn(2, 12, 9, 9, device=cuda_device, requires_grad=True)
    w = torch.randn(24, 4, 3, 3, device=cuda_device, requires_grad=True)
    with count_matrix_flops() as flops:
        F.conv2d(x, w, stride=2, padding=1, groups=3).sum().backward()
    forward = _conv_ops(2, 25, 24, 4, 9)
    assert flops.by_operator() == {"convolution": forward, "convolution_backward": 2 * forward}
    rate = gemm_rate(cuda_device, size=512, repeats=3)
    assert math.isfinite(rate) and rate > 0
