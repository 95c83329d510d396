"""The demo's bootstrap over bursts, camera-grouped folds and input checks (pure, no JVM)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from irbis.demo.data import check_size
from irbis.demo.dataset import check_test_cameras
from irbis.demo.ladder import camera_folds
from irbis.demo.stats import accuracy, bootstrap_ci, roc_auc


def _bursts(n_bursts: int, seed: int = 0, frames: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.repeat(rng.integers(0, 2, n_bursts), frames).astype(float)
    s = np.clip(0.5 + (y - 0.5) * 0.4 + rng.normal(0, 0.25, len(y)), 0, 1)
    return y, s, np.repeat(np.arange(n_bursts), frames)


@pytest.mark.parametrize("metric", [accuracy, roc_auc])
def test_interval_covers_the_point_and_shrinks_with_more_bursts(metric):
    widths = []
    for n in (20, 320):
        point, low, high = bootstrap_ci(metric, *_bursts(n), n_boot=400)
        assert low <= point <= high
        widths.append(high - low)
    assert widths[1] < widths[0] / 2


def test_paired_difference_of_a_variant_with_itself_is_zero():
    y, s, g = _bursts(30)
    assert bootstrap_ci(roc_auc, y, s, g, baseline=s, n_boot=50) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="at least 2 bursts"):
        bootstrap_ci(accuracy, y, s, np.zeros(len(y)))


def test_folds_are_whole_training_cameras():
    cams = np.repeat([f"cam{i:02d}" for i in range(10)], 5)
    is_test = np.isin(cams, ["cam03", "cam07"])
    folds = camera_folds(cams, is_test, 3)
    assert (folds[is_test] == -1).all() and set(folds[~is_test]) == {0, 1, 2}
    assert pd.Series(folds).groupby(cams).nunique().max() == 1
    with pytest.raises(ValueError, match="at least 3 training cameras"):
        camera_folds(cams, ~np.isin(cams, ["cam01", "cam02"]), 3)


def test_bad_size_and_too_few_test_cameras_say_so():
    with pytest.raises(ValueError, match="--size 'huge' does not exist; choose one of small, default, large"):
        check_size("huge")
    meta = pd.DataFrame({"camera": ["a", "a", "b"], "is_test": [True, True, False]})
    with pytest.raises(ValueError, match="too few test cameras for confidence intervals: 1 held out of 2"):
        check_test_cameras(meta)
