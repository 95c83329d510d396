"""ImageLIME builds the network's inputs for its masked samples from the image preprocessed once
(:func:`irbis.kernels.image.network_input.masked_inputs`): the same inputs as preprocessing each masked
full-size image, up to the full path's rounding to 8 bits, and so the same explanations (rank correlation
of the weights >= 0.95) on real photographs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from irbis.explain.explanations import explain_image
from irbis.explain.segment import mask_images, superpixel_masks, superpixels
from irbis.kernels.blocks import Prepared
from irbis.kernels.image.network_input import masked_inputs, preprocess_rgb, to_rgb8
from irbis.models.preprocess import Preprocessing


def _photo(name: str, scale: int = 2) -> np.ndarray:
    from skimage import data

    rgb = getattr(data, name)()[::scale, ::scale]
    return np.ascontiguousarray(rgb[..., ::-1])  # BGR, as an image struct holds it


def test_without_a_resize_the_masked_inputs_equal_the_preprocessed_masked_images():
    image = _photo("chelsea", 3)  # 100 x 151
    spec = Preprocessing(input_size=image.shape[:2], mean=(124.0, 116.0, 104.0), std=(58.0, 57.0, 57.0),
                         color_order="BGR")
    segments = superpixels(image, 20)
    masks = superpixel_masks(np.random.default_rng(1), 6, int(segments.max()) + 1)
    fast = masked_inputs(image, segments, spec)(masks)
    slow = np.stack([preprocess_rgb(to_rgb8(m), spec) for m in mask_images(image, segments, masks)])
    assert fast.shape == slow.shape == (6, 3, *image.shape[:2]) and fast.dtype == np.float32
    np.testing.assert_allclose(fast, slow, atol=1e-5)
    assert not np.allclose(fast[0], fast[1])  # the masks differ, so do the inputs


@pytest.mark.parametrize("name", ["coffee", "chelsea"])
def test_through_a_bicubic_resize_and_crop_the_inputs_differ_by_the_rounding_alone(name):
    from irbis.models import get_entry

    image = _photo(name, 1)
    spec = get_entry("efficientnet_lite0").preprocessing  # bicubic to 256 on the shorter side, centre 224
    segments = superpixels(image, 24)
    masks = superpixel_masks(np.random.default_rng(2), 8, int(segments.max()) + 1)
    fast = masked_inputs(image, segments, spec)(masks)
    slow = np.stack([preprocess_rgb(to_rgb8(m), spec) for m in mask_images(image, segments, masks)])
    half_level = 0.5 / min(spec.std)
    assert np.abs(fast - slow).max() <= half_level + 1e-6  # the full path rounds its resized pixels


@pytest.mark.parametrize("name", ["chelsea", "coffee"])
def test_explanations_agree_with_masking_the_full_size_image(name):
    """EfficientNet-Lite0's two most likely classes on a photograph, explained both ways from the same
    masks: the superpixels' weights rank alike (Spearman's rho >= 0.95)."""
    from irbis.ml.image_featurizer import ImageFeaturizer
    from irbis.ml.lime import ImageLIME

    net = ImageFeaturizer(inputCol="image", outputCol="logits", cutOutputLayers=0, engine="torch")
    lime = ImageLIME(model=net, targetCol="logits", targetClasses=[0], numSamples=300)
    kernel = lime._make_batch_fn()
    score, spec = kernel.score, kernel.settings["network_input"]
    assert spec is not None  # the network reads the image column in the task: LIME masks its input
    image = _photo(name, 1)
    logits = score([image])[0]
    targets = list(np.argsort(-logits)[:2])
    segments = superpixels(image, 48)
    common = dict(num_samples=120, segments=segments, seed=0, batch_size=60)
    slow = explain_image(image, score, targets, **common)
    masked = masked_inputs(image, segments, spec)
    fast = explain_image(image, score, targets, inputs=lambda m: Prepared(masked(m)), **common)
    for k in range(len(targets)):
        rho = spearmanr(slow.weights[k], fast.weights[k]).statistic
        assert rho >= 0.95, (name, targets[k], rho)
