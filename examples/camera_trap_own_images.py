"""Run the camera-trap ladder on your own images and score new frames with the saved pipeline.

Usage: python examples/camera_trap_own_images.py IMAGES_DIR [OUTPUT_DIR]

IMAGES_DIR is either IMAGES_DIR/<label>/<camera>/<burst>/<image> or a folder with metadata.csv
(columns path,label,camera,burst; path relative to the folder). The class to detect is "animal".
"""
import sys

from pyspark.ml import PipelineModel
from pyspark.ml.functions import vector_to_array

import irbis
from irbis.demo.camera_trap import run_demo
from irbis.spark.images import read_images

images = sys.argv[1]
output = sys.argv[2] if len(sys.argv) > 2 else "camera-trap-output"
spark = irbis.get_spark("local[2]")
result = run_demo(spark, output, images, positive="animal")
print(result.table)

model = PipelineModel.load(f"{output}/model")  # the best variant's per-image pipeline
frames = read_images(images, spark=spark, dropInvalid=True, pathGlobFilter="*.jpg")
scored = model.transform(frames).select("path", vector_to_array("probability")[1].alias("p_animal"))
scored.orderBy("p_animal", ascending=False).show(5, truncate=60)
