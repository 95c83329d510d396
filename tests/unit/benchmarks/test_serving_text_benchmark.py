"""The text serving benchmark's pure helpers: its figures, its request bodies and its verdict."""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
from serving_text import agreement, request_bodies, summarize, table, verdict  # noqa: E402


def test_summarize_gives_rate_percentiles_and_error_kinds():
    r = summarize([i / 1000 for i in range(1, 101)], wall_s=2.0, errors={"HTTP 503": 2, "timeout": 1})
    assert r["requests"] == 100 and r["rps"] == 50.0
    assert r["p50"] == np.percentile(np.arange(1, 101), 50) and abs(r["p99"] - 99.01) < 1e-9
    assert r["errors"] == 3 and r["kinds"] == "2 HTTP 503, 1 timeout"
    assert summarize([], 1.0, {})["requests"] == 0


def test_request_bodies_are_one_review_each_in_one_seeded_order():
    texts = [f"review {i}" for i in range(20)]
    bodies = request_bodies(texts)
    assert bodies == request_bodies(texts) and bodies != request_bodies(texts, seed=1)
    assert sorted(json.loads(b)["review"] for b in bodies) == sorted(texts)


def test_verdict_holds_each_irbis_setting_to_the_baselines_best_on_each_measure():
    row = {"clients": 16, "p50": 1.0, "requests": 10, "load": 1.0, "kinds": ""}
    rows = [{**row, "server": "baseline", "settings": "a", "rps": 30.0, "p99": 500.0, "errors": 0},
            {**row, "server": "baseline", "settings": "b", "rps": 20.0, "p99": 100.0, "errors": 0},
            {**row, "server": "irbis", "settings": "--processes 2", "rps": 50.0, "p99": 90.0, "errors": 0},
            {**row, "server": "irbis", "settings": "--processes 1", "rps": 40.0, "p99": 400.0, "errors": 0}]
    first, second = verdict(rows)
    # the default comes first, and is held to a's requests/s and b's p99 together
    assert "--processes 1, the default) does NOT meet it" in first
    assert "baseline (a) 30.0" in first and "baseline (b) 100.0 ms" in first
    assert "--processes 2, not the default) meets it" in second
    rows[3]["p99"] = 100.0
    assert "the default) meets it" in verdict(rows)[0]
    rows[3]["errors"] = 1
    assert "does NOT meet it" in verdict(rows)[0]
    assert "not measured" in verdict(rows[:2])[0]
    assert len(table(rows)) == 6


def test_agreement_is_the_lowest_cosine_across_sides():
    v = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert "min cosine 1.000000 (>=" in agreement({"baseline (x)": v, "irbis (y)": v * 2})
    assert "BELOW" in agreement({"baseline (x)": v, "irbis (y)": v[::-1]})
    assert "not compared" in agreement({"irbis (y)": v})
