"""Average per-frame scores over camera bursts with EnsembleByKey (the "+E" step of the demo).

Usage: python examples/burst_ensemble.py
"""
import irbis
from irbis.ml.ensemble_by_key import EnsembleByKey

spark = irbis.get_spark("local[2]")
frames = spark.createDataFrame(
    [("cam1", "b1", "f0", 0.9), ("cam1", "b1", "f1", 0.3), ("cam1", "b1", "f2", 0.8),
     ("cam2", "b7", "f0", 0.2), ("cam2", "b7", "f1", 0.1)],
    "camera string, burst string, frame string, score double")
# Keep every frame and append its burst's mean score: the hard frame f1 of b1 is rescued by its neighbours.
per_frame = EnsembleByKey(keys=["camera", "burst"], cols=["score"], colNames=["burst_score"],
                          collapseGroup=False).transform(frames)
per_frame.orderBy("camera", "frame").show()
# Or one row per burst.
EnsembleByKey(keys=["camera", "burst"], cols=["score"]).transform(frames).show()
