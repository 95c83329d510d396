"""``calibrationData`` given as a DataFrame: a sample of the stage's own input rows, kept as a folder.

The Param stays a string (a folder path), so a stage persists as JSON. A Spark DataFrame given to
``setCalibrationData`` or to the constructor is sampled on the driver when it is set (at most
:data:`SAMPLE_ROWS` non-null rows, picked by a seeded random order, so the same DataFrame gives the
same sample), turned into the network's input rows by the stage's own input conversion (the one its
``transform`` runs), and written as ``.npy`` rows into a folder of the Irbis cache named by their
content (:func:`irbis.kernels.calibration.write_rows`); the Param holds that folder. Only public
DataFrame APIs are used (``orderBy``, ``limit``, ``toArrow``), so it works on Spark Connect too.

Saving a stage copies its calibration folder beside the stage (``calibration/`` among its sidecar
files) and loading points the Param at the copy, so a stage loads where the folder is absent.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from irbis.errors import require_columns
from irbis.kernels.blocks import from_arrow
from irbis.kernels.calibration import write_rows
from irbis.ml.params import HasCalibrationData
from irbis.spark.columns import column

__all__ = ["HasCalibrationSample", "SAMPLE_ROWS", "SAMPLE_SEED", "SAVED_FOLDER"]

#: Rows sampled from a calibration DataFrame (ONNX Runtime's ranges settle well before that).
SAMPLE_ROWS = 256
#: Seed of the random order that picks the sampled rows.
SAMPLE_SEED = 0
#: The sidecar folder of a saved stage that holds its calibration sample.
SAVED_FOLDER = "calibration"


class HasCalibrationSample(HasCalibrationData):
    """``calibrationData`` as a folder, or a Spark DataFrame of the stage's input column sampled into one.

    A stage using it implements :meth:`_network_rows`, its input conversion from a column block to
    the network's input rows, which its ``transform`` also runs.
    """

    def setCalibrationData(self, value: "str | DataFrame") -> Any:  # noqa: N802
        """Sets calibrationData: a folder of images or ``.npy`` rows, or a DataFrame holding the
        stage's input column (sampled now, with the stage's Params as they are now)."""
        return self._set(calibrationData=value)

    def _set(self, **kwargs: Any) -> Any:
        data = kwargs.get("calibrationData")
        if isinstance(data, DataFrame):  # the other Params first: the sample is converted with them
            super()._set(**{k: v for k, v in kwargs.items() if k != "calibrationData"})
            kwargs = {"calibrationData": self._sample_folder(data)}
        return super()._set(**kwargs)

    def _sample_folder(self, df: DataFrame) -> str:
        """Sample ``df``'s input column, convert it as the stage does, write it; return the folder."""
        name, col = type(self).__name__, self.getInputCol()
        require_columns(name, df.columns, [col], role="input column of the calibration DataFrame")
        self._validate_schema(df.schema)
        picked = (df.where(column(col).isNotNull()).orderBy(F.rand(SAMPLE_SEED)).limit(SAMPLE_ROWS)
                  .select(self._udf_input(df.schema[col])))
        table = picked.toArrow()
        if table.num_rows == 0:
            raise ValueError(f"{name}: the calibration DataFrame has no non-null rows in column {col!r}; int8 "
                             f"calibration needs a sample of real inputs")
        return self._calibration_folder(from_arrow(table.column(0), col))

    def _calibration_folder(self, block: Any) -> str:
        """The calibration folder of a sampled input column block: the network's input rows, as ``.npy``."""
        return write_rows(self._network_rows(block))

    def _network_rows(self, block: Any) -> np.ndarray:
        """The network's input rows (N, *input) float32 of the non-null rows of an input column block."""
        raise NotImplementedError

    def _save_calibration(self, path: str) -> None:
        """Copy the calibration folder (if any) into the stage's sidecar folder ``path``."""
        folder = self.getCalibrationData()
        if folder:
            shutil.copytree(folder, Path(path) / SAVED_FOLDER)

    def _load_calibration(self, path: str) -> None:
        """Point calibrationData at the copy that :meth:`_save_calibration` wrote, when there is one."""
        saved = Path(path) / SAVED_FOLDER
        if saved.is_dir():
            self._set(calibrationData=str(saved))

    def _sidecar_params(self) -> tuple[str, ...]:
        return ("calibrationData",)
