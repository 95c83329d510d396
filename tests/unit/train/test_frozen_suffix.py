"""frozen_suffix: the layers after freezeUntil as a module of their own, where the network cuts there."""

import torch
from torch import nn

from irbis.train.finetune import finetune_network, freeze_until, frozen_suffix


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.body = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.mid = nn.Conv2d(4, 4, 1)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        s = self.stem(x)
        y = self.body(s)
        return self.head((self.mid(y) + s).mean((2, 3)))  # s skips over body and mid


def _activation(net, layer, x):
    seen = []
    handle = net.get_submodule(layer).register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        out = net(x)
    handle.remove()
    return seen[0], out


def test_efficientnet_after_a_block_gives_the_whole_networks_output_and_keeps_its_parameter_names():
    torch.manual_seed(0)
    net = finetune_network("efficientnet_lite0", 3, "_blocks.12", seed=0, pretrained=False).eval()
    suffix, why = frozen_suffix(net, "_blocks.12")
    assert why == "" and suffix is not None
    x = torch.randn(2, 3, 224, 224)
    cut, whole = _activation(net, "_blocks.12", x)
    with torch.no_grad():
        torch.testing.assert_close(suffix.eval()(cut), whole)
    trainable = {n for n, p in net.named_parameters() if p.requires_grad}
    assert {n for n, p in suffix.named_parameters()} == trainable  # exactly the layers that train
    assert set(suffix.state_dict()) <= set(net.state_dict())


def test_a_cut_that_a_skip_connection_crosses_is_refused_naming_it():
    net = Residual()
    freeze_until(net, "body")
    suffix, why = frozen_suffix(net, "body")
    assert suffix is None and "skip connection" in why and "body" in why


def test_a_cut_with_trainable_layers_before_it_is_refused():
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    freeze_until(net, "0")
    assert frozen_suffix(net, "0")[0] is not None
    net[0].weight.requires_grad_(True)
    suffix, why = frozen_suffix(net, "0")
    assert suffix is None and "trains" in why


def test_training_the_suffix_trains_the_whole_networks_layers():
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    freeze_until(net, "0")
    suffix, _ = frozen_suffix(net, "0")
    before = net[2].weight.detach().clone()
    opt = torch.optim.SGD([p for p in suffix.parameters()], lr=0.5)
    nn.functional.cross_entropy(suffix(torch.randn(5, 8)), torch.tensor([0, 1, 0, 1, 1])).backward()
    opt.step()
    assert not torch.equal(net[2].weight, before)


def test_the_suffix_factory_trains_channels_last_from_an_nchw_input_and_flat_params_keep_it():
    from irbis.train.finetune import finetune_suffix
    from irbis.train.strategy import FlatParams

    torch.manual_seed(0)
    suffix = finetune_suffix("efficientnet_lite0", 2, "_blocks.12", seed=0, pretrained=False).train()
    convs = [p for p in suffix.parameters() if p.dim() == 4]

    def channels_last(w: torch.Tensor) -> bool:  # the strides themselves: a 1x1 or a depthwise kernel is
        _, c, h, wd = w.shape                    # "contiguous" in both layouts, yet oneDNN reads its strides
        return w.stride() == (c * h * wd, 1, wd * c, c)

    assert convs and all(channels_last(w) for w in convs)
    flat = FlatParams(list(suffix.parameters()))  # the strategies' one buffer keeps the layout
    assert all(channels_last(w) for w in convs)
    x = torch.randn(4, 192, 7, 7)  # the frozen layers' output, as a tensor column gives it: NCHW
    out = suffix(x)
    assert out.shape == (4, 2)
    nn.functional.cross_entropy(out, torch.tensor([0, 1, 0, 1])).backward()
    flat.sync_grads_in()
    assert float(flat.grads.abs().sum()) > 0  # every gradient lands in the flat buffer
    nchw = finetune_suffix("efficientnet_lite0", 2, "_blocks.12", seed=0, pretrained=False).eval()
    nchw = nchw.to(memory_format=torch.contiguous_format)
    nchw.load_state_dict(suffix.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(suffix.eval()(x), nchw(x), rtol=1e-4, atol=1e-5)
