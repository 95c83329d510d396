"""Training-time augmentation: validated ops, seeded draws, and the one geometry of the model's card."""
import numpy as np
import pytest
from skimage import data

from irbis.kernels.image.augment import augment_rgb, parse_augmentation
from irbis.kernels.image.network_input import preprocess_rgb
from irbis.models import get_entry

SPEC = get_entry("efficientnet_lite0").preprocessing
CAT = data.chelsea()


def test_bad_ops_are_named_with_the_argument():
    with pytest.raises(ValueError, match="unknown augmentation op 'spin'"):
        parse_augmentation('[{"op": "spin"}]')
    with pytest.raises(ValueError, match=r"'flip': flip_code=2 is invalid; expected one of \[-1, 0, 1\]"):
        parse_augmentation([{"op": "flip", "flip_code": 2}])
    with pytest.raises(ValueError, match=r"'grey': p=1.5 is invalid"):
        parse_augmentation([{"op": "grey", "p": 1.5}])
    with pytest.raises(ValueError, match="unknown arguments \\['angle'\\]"):
        parse_augmentation([{"op": "rotate", "angle": 3}])
    with pytest.raises(ValueError, match="JSON list"):
        parse_augmentation('{"op": "flip"}')


def test_no_op_that_fires_gives_the_inference_preprocessing_exactly():
    ops = parse_augmentation([{"op": "flip", "p": 0.0}, {"op": "grey", "p": 0.0}])
    out = augment_rgb(CAT, SPEC, ops, np.random.default_rng(0))
    np.testing.assert_array_equal(out, preprocess_rgb(CAT, SPEC))


def test_draws_follow_the_generator_and_each_op_does_what_it_says():
    ops = parse_augmentation([{"op": "random_resized_crop", "scale": [0.3, 1.0]}, {"op": "flip", "p": 0.5},
                              {"op": "rotate", "degrees": 15}, {"op": "color_jitter"}, {"op": "grey", "p": 0.5}])
    a = augment_rgb(CAT, SPEC, ops, np.random.default_rng(7))
    b = augment_rgb(CAT, SPEC, ops, np.random.default_rng(7))
    c = augment_rgb(CAT, SPEC, ops, np.random.default_rng(8))
    assert a.shape == (3, 224, 224) and np.array_equal(a, b) and not np.array_equal(a, c)
    flipped = augment_rgb(CAT, SPEC, parse_augmentation([{"op": "flip"}]), np.random.default_rng(0))
    np.testing.assert_array_equal(flipped, preprocess_rgb(CAT, SPEC)[:, :, ::-1])
    grey = augment_rgb(CAT, SPEC, parse_augmentation([{"op": "grey"}]), np.random.default_rng(0))
    assert np.array_equal(grey[0] * SPEC.std[0] + SPEC.mean[0], grey[1] * SPEC.std[1] + SPEC.mean[1]) or \
        np.allclose(grey[0] * SPEC.std[0] + SPEC.mean[0], grey[1] * SPEC.std[1] + SPEC.mean[1], atol=1e-3)
    assert not np.allclose(preprocess_rgb(CAT, SPEC)[0] * SPEC.std[0] + SPEC.mean[0],
                           preprocess_rgb(CAT, SPEC)[1] * SPEC.std[1] + SPEC.mean[1], atol=1)


def test_random_resized_crop_covers_the_scale_it_is_given():
    ops = parse_augmentation([{"op": "random_resized_crop", "scale": [1.0, 1.0], "ratio": [1.5, 1.5]}])
    wide = np.zeros((200, 300, 3), np.uint8)
    wide[:, :150] = 255  # left half white: a full-area crop of ratio 1.5 keeps half the pixels white
    out = augment_rgb(wide, SPEC, ops, np.random.default_rng(0))
    white = (out[0] * SPEC.std[0] + SPEC.mean[0]) > 128
    assert 0.45 < white.mean() < 0.55
