"""FlatParams re-homes a model's parameters into one flat buffer without changing their values or layout."""

import torch

from irbis.train.strategy import FlatParams


def _net(channels_last: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 4, 1), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
    return net.to(memory_format=torch.channels_last) if channels_last else net


def test_channels_last_weights_keep_their_layout_and_values_and_grads_land_in_the_buffer():
    net = _net(True)
    before = {k: v.detach().clone() for k, v in net.state_dict().items()}
    flat = FlatParams(list(net.parameters()))
    conv = net[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k
    x = torch.randn(5, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    torch.nn.functional.cross_entropy(net(x), torch.tensor([0, 1, 0, 1, 1])).backward()
    flat.sync_grads_in()
    lo, hi = flat.grads.data_ptr(), flat.grads.data_ptr() + flat.grads.numel() * flat.grads.element_size()
    assert all(lo <= p.grad.data_ptr() < hi for p in flat.params)
    assert float(flat.grads.abs().sum()) > 0
    # the same step on a plain NCHW copy gives the same gradients, parameter by parameter
    ref = _net(False)
    torch.nn.functional.cross_entropy(ref(x.contiguous()), torch.tensor([0, 1, 0, 1, 1])).backward()
    for p, q in zip(flat.params, ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_a_step_on_the_flat_buffer_moves_the_parameters():
    net = _net(True)
    flat = FlatParams(list(net.parameters()))
    w0 = net[0].weight.detach().clone()
    flat.weights.add_(1.0)
    torch.testing.assert_close(net[0].weight.detach(), w0 + 1.0)
