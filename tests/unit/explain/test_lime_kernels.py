"""The pure LIME kernels: the local fit, superpixels and masks, known answers, the reference package."""
from __future__ import annotations

import numpy as np
import pytest
from skimage import data

from irbis.explain import (
    FeatureStats,
    cosine_distance,
    explain_image,
    explain_rows,
    exponential_kernel,
    mask_images,
    plot_feature_weights,
    plot_image_explanation,
    superpixel_masks,
    superpixels,
    weighted_ridge,
)
from irbis.kernels.sparkml.stage_kernels import logistic_regression

PNG = b"\x89PNG"


def quadrant_score(batch: np.ndarray) -> np.ndarray:
    """A model that looks only at the mean of the top-left quadrant."""
    h, w = batch.shape[1] // 2, batch.shape[2] // 2
    return batch[:, :h, :w].mean(axis=(1, 2, 3))[:, None] / 255.0


def test_weighted_ridge_recovers_a_linear_function_with_r2_one():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4))
    y = np.stack([x @ [1.0, -2.0, 0.0, 0.5] + 3.0, 2 * x[:, 3]], axis=1)
    coef, intercept, r2 = weighted_ridge(x, y, rng.random(200))
    np.testing.assert_allclose(coef, [[1.0, -2.0, 0.0, 0.5], [0, 0, 0, 2.0]], atol=1e-6)
    np.testing.assert_allclose(intercept, [3.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(r2, [1.0, 1.0])


def test_ridge_penalty_shrinks_and_noise_lowers_r2():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(100, 3))
    y = x[:, :1] + rng.normal(size=(100, 1))
    plain, _, r2 = weighted_ridge(x, y, np.ones(100))
    shrunk, _, _ = weighted_ridge(x, y, np.ones(100), alpha=100.0)
    assert abs(shrunk[0, 0]) < abs(plain[0, 0]) and 0.2 < r2[0] < 0.8
    with pytest.raises(ValueError, match="-1"):
        weighted_ridge(x, y, np.ones(100), alpha=-1)


def test_kernel_and_distances():
    np.testing.assert_allclose(exponential_kernel(np.array([0.0, 1.0]), 1.0), [1.0, np.exp(-0.5)])
    masks = np.array([[1, 1], [1, 0], [0, 0]])
    np.testing.assert_allclose(cosine_distance(masks), [0.0, 1 - 1 / np.sqrt(2), 1.0], atol=1e-12)
    with pytest.raises(ValueError, match="width"):
        exponential_kernel(np.zeros(2), 0.0)


def test_superpixels_cover_the_image_and_masks_black_out_what_is_off():
    image = data.astronaut()[::8, ::8]
    segments = superpixels(image, cell_size=16)
    count = segments.max() + 1
    assert segments.shape == image.shape[:2] and set(np.unique(segments)) == set(range(count))
    assert 6 <= count <= 40
    masks = superpixel_masks(np.random.default_rng(0), 50, count, fraction=0.5)
    assert masks[0].all() and 0.3 < masks[1:].mean() < 0.7
    images = mask_images(image, segments, masks[:3])
    off = ~masks[1][segments]
    assert (images[1][off] == 0).all() and (images[1][~off] == image[~off]).all()


def test_an_image_smaller_than_one_superpixel_is_named():
    with pytest.raises(ValueError, match="8x12 pixels is smaller than one superpixel .cellSize=16"):
        superpixels(np.zeros((8, 12, 3), np.uint8), 16)


def test_image_known_answer_the_top_superpixels_lie_in_the_quadrant_the_model_reads():
    image = data.chelsea()[::4, ::4]
    found = explain_image(image, quadrant_score, [0], num_samples=300, cell_size=12)
    h, w = image.shape[0] // 2, image.shape[1] // 2
    inside = np.zeros(image.shape[:2], bool)
    inside[:h, :w] = True
    for label in np.argsort(-found.weights[0])[:4]:
        assert inside[found.segments == label].mean() > 0.5
    outside = [s for s in range(found.weights.shape[1]) if inside[found.segments == s].mean() == 0]
    assert np.abs(found.weights[0, outside]).max() < 1e-6 and found.r2[0] > 0.99


def test_image_errors_name_the_values():
    image = data.chelsea()[::4, ::4]
    with pytest.raises(ValueError, match="numSamples=5 is below the number of superpixels"):
        explain_image(image, quadrant_score, [0], num_samples=5)
    with pytest.raises(ValueError, match="target class 3 is out of range: the model's 'score' has 1 values"):
        explain_image(image, quadrant_score, [3], num_samples=60, target_name="score")


def _two_feature_model(batch: np.ndarray) -> np.ndarray:
    margin = 2.0 * batch[:, 2] - 1.5 * batch[:, 5]
    return np.stack([1 / (1 + np.exp(margin)), 1 / (1 + np.exp(-margin))], axis=1)


def test_table_known_answer_the_two_features_the_model_uses_rank_first():
    rng = np.random.default_rng(0)
    background = rng.normal(size=(500, 8))
    weights, r2 = explain_rows(background[:20], _two_feature_model, FeatureStats.from_data(background), [1],
                               num_samples=500)
    assert weights.shape == (20, 1, 8) and (r2 > 0.5).all()
    for row in weights[:, 0]:
        assert set(np.argsort(-np.abs(row))[:2]) == {2, 5}
        assert row[2] > 0 > row[5]


def test_table_errors_name_the_values():
    stats = FeatureStats.from_data(np.random.default_rng(0).normal(size=(50, 8)))
    with pytest.raises(ValueError, match="numSamples=5 is below the number of features .8."):
        explain_rows(np.zeros((1, 8)), _two_feature_model, stats, [1], num_samples=5)
    with pytest.raises(ValueError, match="target class 2 is out of range"):
        explain_rows(np.zeros((1, 8)), _two_feature_model, stats, [2], num_samples=50)


def test_feature_stats_ignore_nan_and_give_constant_features_unit_spread():
    stats = FeatureStats.from_data(np.array([[1.0, 5.0, np.nan], [3.0, 5.0, np.nan]]))
    np.testing.assert_allclose(stats.mean, [2.0, 5.0, 0.0])
    np.testing.assert_allclose(stats.std, [1.0, 1.0, 1.0])


def test_top3_features_agree_with_the_reference_lime_package():
    from lime.lime_tabular import LimeTabularExplainer
    from sklearn.datasets import load_wine
    from sklearn.linear_model import LogisticRegression

    x, y = load_wine(return_X_y=True)
    fitted = LogisticRegression(C=0.1, max_iter=5000).fit((x - x.mean(0)) / x.std(0), y)
    coef = fitted.coef_ / x.std(0)
    intercept = fitted.intercept_ - coef @ x.mean(0)

    def predict(rows: np.ndarray) -> np.ndarray:
        return logistic_regression(rows, coef, intercept)[1]

    rows, samples = x[::6][:30], 2000
    ours, _ = explain_rows(rows, predict, FeatureStats.from_data(x), [1], num_samples=samples, alpha=1.0)
    reference = LimeTabularExplainer(x, discretize_continuous=False, feature_selection="none", random_state=0)
    agree = 0
    for i, row in enumerate(rows):
        found = reference.explain_instance(row, predict, labels=(1,), num_features=x.shape[1],
                                           num_samples=samples)
        top = {f for f, _ in sorted(found.as_map()[1], key=lambda p: -abs(p[1]))[:3]}
        agree += top == set(np.argsort(-np.abs(ours[i, 0]))[:3])
    assert agree >= 0.9 * len(rows)


def test_pictures_are_png(tmp_path):
    image = data.chelsea()[::4, ::4]
    found = explain_image(image, quadrant_score, [0], num_samples=100, cell_size=20)
    png = plot_image_explanation(image, found.segments, found.weights[0], top=3, title="cat",
                                 path=tmp_path / "a.png")
    assert png.startswith(PNG) and (tmp_path / "a.png").read_bytes() == png
    assert plot_feature_weights([0.5, -1.0, 0.1], ["a", "b", "c"]).startswith(PNG)
    with pytest.raises(ValueError, match="2 feature names for 3 weights"):
        plot_feature_weights([0.5, -1.0, 0.1], ["a", "b"])
