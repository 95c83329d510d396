"""Write tests/data/saved_stages: a small saved pipeline, two stages of it saved alone, and the outputs.

The tests read these folders as a ready-made saved pipeline (the serving tests with no JVM). Run from
the repository root, with Irbis and a Java for Spark: ``python tests/data/make_saved_stages.py``. The
README beside the data says what each folder holds.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "saved_stages"
#: What the saved TorchModel's ``network`` says; the loaders take the network from the stage's own files.
NETWORK = "/models/mlp"


def _mlp_folder(folder: Path) -> Path:
    """A model folder (architecture.json + weights.pt) of the catalogue's ``mlp`` 3 -> 4 -> 2."""
    import torch

    from irbis.models.small import mlp

    options = {"in_features": 3, "hidden": 4, "out_features": 2}
    folder.mkdir()
    (folder / "architecture.json").write_text(json.dumps({"architecture": "mlp", "options": options}))
    torch.save(mlp(**options, seed=0).state_dict(), folder / "weights.pt")
    return folder


def _tidy(folder: Path) -> None:
    """Drop Hadoop's ``.crc`` files (no loader needs them) and put ``NETWORK`` in each saved TorchModel's
    metadata instead of the temporary folder it was built from."""
    for crc in folder.rglob(".*.crc"):
        crc.unlink()
    for part in folder.rglob("metadata/part-*"):
        metadata = json.loads(part.read_text())
        if metadata["class"] == "irbis.ml.torch_model.TorchModel":
            metadata["paramMap"]["network"] = NETWORK
            part.write_text(json.dumps(metadata, separators=(",", ":")) + "\n")


def main() -> int:
    from pyspark.ml import Pipeline
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.feature import StandardScaler, VectorAssembler

    from irbis.ml import ImageTransformer, TorchModel
    from irbis.spark.session import get_spark

    spark = get_spark("local[1]", app_name="make-saved-stages", **{"spark.ui.enabled": "false",
                                                                   "spark.sql.shuffle.partitions": "1"})
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3))
    y = (x @ [1.0, -0.5, 0.25] + rng.normal(scale=0.5, size=64) > 0).astype(float)
    train = spark.createDataFrame([(*map(float, row), float(label)) for row, label in zip(x, y)],
                                  "a double, b double, c double, y double").coalesce(1)
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        network = TorchModel(network=str(_mlp_folder(Path(tmp) / "mlp")), inputCol="scaled", outputCol="scores",
                             inputShape=[3])
        pipeline = Pipeline(stages=[VectorAssembler(inputCols=["a", "b", "c"], outputCol="features"),
                                    StandardScaler(inputCol="features", outputCol="scaled", withMean=True),
                                    LogisticRegression(featuresCol="scaled", labelCol="y", regParam=0.1),
                                    network]).fit(train)
        pipeline.write().save(str(OUT / "tabular_pipeline"))
        network.write().save(str(OUT / "torch_model"))
        inputs = [dict(zip("abc", map(float, row))) for row in rng.normal(size=(5, 3))]
        frame = spark.createDataFrame([(r["a"], r["b"], r["c"]) for r in inputs], "a double, b double, c double")
        outputs = [{"scaled": r.scaled.toArray().tolist(), "probability": r.probability.toArray().tolist(),
                    "prediction": r.prediction, "scores": r.scores.toArray().tolist()}
                   for r in pipeline.transform(frame.coalesce(1)).collect()]
    transformer = ImageTransformer(inputCol="image", outputCol="small", outputFormat="vector")
    transformer.resize(4, 4).colorFormat("RGB").write().save(str(OUT / "image_transformer"))
    (OUT / "expected.json").write_text(json.dumps({"inputs": inputs, "outputs": outputs}, indent=1) + "\n")
    _tidy(OUT)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
