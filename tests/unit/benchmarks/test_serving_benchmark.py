"""The serving benchmark's plain endpoint runs the network on the engine settings ``irbis serve`` uses."""

import sys
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
from serving import plain_app  # noqa: E402

SAVED = Path(__file__).resolve().parents[2] / "data" / "saved_stages" / "image_transformer"


def test_the_plain_endpoint_stops_engine_spinning_as_irbis_serve_does_and_answers():
    from starlette.testclient import TestClient

    from irbis.kernels.engines import ort

    before = list(ort._SPIN_BETWEEN_RUNS)
    ort.set_thread_spinning(True)
    try:
        app = plain_app(str(SAVED), ["small"])
        assert ort._SPIN_BETWEEN_RUNS == [False]  # as irbis.serving.server.build_app sets it
    finally:
        ort._SPIN_BETWEEN_RUNS[:] = before
    photo = np.zeros((8, 6, 3), np.uint8)
    photo[:4] = 200
    ok, jpeg = cv2.imencode(".png", photo)
    with TestClient(app) as client:
        answer = client.post("/predict", content=jpeg.tobytes(), headers={"content-type": "image/png"})
    assert answer.status_code == 200, answer.text
    small = answer.json()["small"]
    assert len(small) == 4 * 4 * 3 and max(small) == 200 and min(small) == 0
