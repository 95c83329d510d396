"""``TorchModel``: run a PyTorch network over a DataFrame column, as one stage of a Spark ML pipeline."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pyspark.ml.param import TypeConverters
from pyspark.sql import DataFrame
from pyspark.sql.types import DataType, StringType, StructType
from torch import nn

from irbis.kernels.blocks import BatchFn
from irbis.kernels.inference import NetworkKernel, resolve_source
from irbis.ml.base import IrbisModel
from irbis.ml.calibration_sample import HasCalibrationSample
from irbis.ml.export_ahead_of_job import export_ahead_of_job
from irbis.ml.image_network import is_image_column
from irbis.ml.network_params import NetworkStageParams, check_network_input
from irbis.ml.params import (
    HasEngine,
    HasErrorCol,
    HasImagePreprocessing,
    HasInputCols,
    HasInputShapes,
    HasPrecision,
    param_mixin,
)
from irbis.ml.persistence import load_network_files, save_network_files
from irbis.models import default_cache_dir, sha256_file
from irbis.models.fetch import place_folder
from irbis.models.module_files import write_module
from irbis.train.progress import SummaryAttribute

HasAllowPickle: Any = param_mixin("allowPickle", "allow model files that need full unpickling (only for files you "
                                  "trust)", TypeConverters.toBoolean, False)


class TorchModel(NetworkStageParams, HasPrecision, HasCalibrationSample, HasEngine, HasErrorCol, HasImagePreprocessing,
                 HasInputCols, HasInputShapes, HasAllowPickle, IrbisModel):
    """Run a PyTorch network over a column: the network's output (or an inner layer's) per row.

    The network runs in every Spark Python worker on Arrow batches of ``miniBatchSize`` rows, under
    ``torch.inference_mode``, with as many threads as the task owns. It is loaded once per worker; its
    prepared weights are memory-mapped from one file, so all workers of a machine share one copy.

    Parameters
    ----------
    network : str
        A ``torch.export`` archive (``.pt2``), a TorchScript file (whole outputs only), a model folder
        (``architecture.json`` + ``weights.pt``) or a model name of the catalogue (:data:`irbis.models.MODELS`:
        built-in, or added with :func:`irbis.models.register_model`) such as ``"efficientnet_lite0"``.
    inputCol, outputCol : str
        Input column (vector, array<float>, nested arrays, image struct or tensor bytes) and output column.
    outputLayer : str
        Return the activation of this inner module (``named_modules()`` name) instead of the output.
    inputShape : list of int
        Shape of one row without the batch axis; flat rows are reshaped to it.
    inputCols, inputShapes : list of str, list of list of int
        Several input columns instead of ``inputCol`` (vectors, arrays of numbers, or tensor bytes of
        ``inputDtype``), each of the row shape of ``inputShapes``; the network's ``forward`` takes them as
        positional arguments in this order. :meth:`from_module` wraps such a network in
        :class:`~irbis.train.networks.SplitInputs`, which takes one flat row of the columns' values side by
        side (``inputShape`` their total), as :class:`~irbis.ml.TorchEstimator` trains and stores it; a null
        in any of the columns gives a null output.
    inputDtype : str
        For a binary input column (rows of raw little-endian tensor bytes, see
        :func:`irbis.spark.tensors.tensor_bytes_column`): ``float32`` (the default), ``float16`` or
        ``uint8``. Such a column crosses to Python as one buffer per batch and is read without a copy,
        several times faster than ``array<float>``, which Spark converts value by value.
    miniBatchSize, device, precision : int, str, str
        Rows per forward pass; ``cpu``/``cuda``/``auto``; ``fp32``/``bf16``/``int8``.
    engine : str
        ``auto`` (the default), ``torch``, ``onnxruntime`` or ``openvino``: the network (cut at
        ``outputLayer``) is exported to ONNX once per machine for the latter two; every engine equals
        eager fp32 within 1e-4 relative to the output's scale
        (:mod:`irbis.kernels.engines` documents ``auto``'s rule).
    calibrationData : str or DataFrame
        For int8 on ``onnxruntime``: a folder of images or ``.npy`` input rows that sets the activation
        ranges, or a DataFrame with an ``inputCol`` like the one transformed, whose sample (up to 256
        rows) is converted as ``transform`` converts its input when set and kept in a cached folder
        (saved with the stage). Empty: photographs shipped with scikit-image, for repository models.
    outputFormat : str
        ``vector`` (Spark ML vector, the default) or ``array`` (array<float>).
    variableLength, tokenBudget : bool, int
        With ``variableLength=True`` the input column holds sequences whose length varies per row:
        ``array<int>`` token ids or ``array<array<float>>`` (steps x features). Within each Arrow batch the
        rows are sorted by length, cut so that ``rows x padded length`` stays under ``tokenBudget`` and rows
        under ``miniBatchSize``, padded to a multiple of 8 and fed as the network's ``input_kind``
        attribute says: ``"padded"`` (the default) ``module(ids, mask)``, ``"packed"`` ``module(packed)``
        (a ``PackedSequence``); outputs come back in the rows' order. The network must give one output
        per row (``(B, C)``); a per-step output is refused with an error (pool the steps in the network).
        It runs on the ``torch`` engine (``auto`` picks it; ``onnxruntime`` and ``openvino`` are refused:
        export the network with dynamic axes and use :class:`~irbis.ml.onnx_model.ONNXModel` with
        ``variableLength=True``), in fp32 or bf16, without ``outputLayer``. :meth:`from_module` stores such a
        network as its state dict and importable class. A null row gets a null output (``"null row"`` in
        ``errorCol``); a row with a null inside or with no steps (``"empty sequence"``) gets a null output
        and its reason in ``errorCol``, or fails the batch naming the column when ``errorCol`` is empty.
    imagePreprocessing : str
        A catalogue model whose preprocessing record (resize, centre crop, colour order, mean/std) the images
        get, or the record as JSON: the input column then holds images (Spark image structs, or encoded image
        files in a binary column), decoded and preprocessed in the worker to the record's input shape, as
        :class:`~irbis.ml.TorchEstimator` trained them with the same value (its fitted model carries it).
        Empty (the default): image structs are read as they are (CHW, their own channel order).
    errorCol : str
        Column for the reason a row has no output (empty, the default: no such column). On fixed-shape
        rows it reports null rows; a row of another shape still fails the job. With ``imagePreprocessing``
        an image that cannot be read gets a null output and its reason here (empty: it fails the job).

    Examples
    --------
    >>> import numpy as np, pandas as pd, torch
    >>> stage = TorchModel.from_module(torch.nn.Linear(2, 1), inputCol="x", outputCol="y")
    >>> out = stage.transform(pd.DataFrame({"x": [np.ones(2, np.float32), None]}))
    >>> out["y"][0].shape, out["y"][1] is None
    ((1,), True)

    .. code-block:: python

        scorer = TorchModel(network="efficientnet_lite0", inputCol="pixels", outputCol="logits",
                            inputShape=[3, 224, 224], precision="bf16")
        Pipeline(stages=[scorer, LogisticRegression(featuresCol="logits")]).fit(df)
    """

    #: The fit's per-epoch records, a list of dicts that shows as a table in a notebook (TrainingSummary).
    training_summary = SummaryAttribute()

    _vector_dtype = "float32"

    _defaults = {"errorCol": ""}

    def _init_state(self) -> None:
        self.training_summary = None

    # -- building from an in-memory network ------------------------------------------------------
    @classmethod
    def from_module(cls, module: nn.Module, *, architecture: str | None = None,
                    options: dict[str, Any] | None = None, **params: Any) -> "TorchModel":
        """Wrap an in-memory network.

        With ``architecture`` (an :data:`irbis.models.ARCHITECTURES` name and its ``options``) the
        weights are saved as a state dict beside ``architecture.json``, which loads memory-mapped and
        safely. Otherwise the network is stored as a ``torch.export`` archive traced on zeros of
        ``inputShape`` (any inner module can then be read with ``outputLayer``), or, when
        ``torch.export`` cannot capture it, as its state dict plus its importable class built with
        ``options`` (see :mod:`irbis.models.module_files`). The files go to a content-addressed folder
        of the Irbis cache, and ``save`` copies them beside the stage.
        """
        if params.get("inputCols") is not None:
            module, params = _split_inputs(module, params)
        eager = bool(params.get("variableLength"))
        if not eager and "inputShape" not in params and recorded_input_shape(module) is not None:
            params["inputShape"] = recorded_input_shape(module)
        modules = default_cache_dir() / "modules"
        modules.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=".staging-", dir=modules))  # on the entries' file system
        try:
            if architecture is not None:
                (folder / "architecture.json").write_text(json.dumps({"architecture": architecture,
                                                                      "options": options or {}}))
                torch.save(module.state_dict(), folder / "weights.pt")
                main = folder
            else:
                main = write_module(module, folder, params.get("inputShape"), options, eager=eager)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        name = main.name if main.is_file() else ""
        digest = sha256_file(main if name else folder / "weights.pt")[:24]
        dest = place_folder(folder, modules / digest)
        return cls(network=str(dest / name if name else dest), **params)

    # -- execution -------------------------------------------------------------------------------
    def _input_columns(self) -> list[str]:
        return list(self.getInputCols()) if self.isDefined(self.inputCols) else [self.getInputCol()]

    def _output_columns(self) -> list[tuple[str, DataType]]:
        err = self.getErrorCol()
        return super()._output_columns() + ([(err, StringType())] if err else [])

    def _validate_network_params(self) -> None:
        super()._validate_network_params()
        if self.isDefined(self.inputCols):
            if self.isSet(self.inputCol):
                raise ValueError(f"TorchModel: inputCol {self.getInputCol()!r} and inputCols "
                                 f"{self.getInputCols()} are exclusive; set one")
            shapes = self.getInputShapes() if self.isDefined(self.inputShapes) else None
            if shapes is None or len(shapes) != len(self.getInputCols()):
                raise ValueError(f"TorchModel: inputCols {self.getInputCols()} needs inputShapes, one row shape "
                                 f"per column, found {shapes}")
            if self.getVariableLength() or self.getImagePreprocessing():
                raise ValueError("TorchModel: inputCols take numbers or tensor bytes; variableLength and "
                                 "imagePreprocessing take one column")
        if self.getImagePreprocessing() and self.getVariableLength():
            raise ValueError("TorchModel: imagePreprocessing reads images and variableLength sequences; set one")
        if not self.getVariableLength():
            return
        refused = [(name, value) for name, value, ok in (
            ("engine", self.getEngine(), self.getEngine() in ("auto", "torch")),
            ("precision", self.getPrecision(), self.getPrecision() in ("fp32", "bf16")),
            ("outputLayer", self.getOutputLayer(), not self.getOutputLayer())) if not ok]
        if refused:
            name, value = refused[0]
            raise ValueError(f"TorchModel: variableLength=True runs the network eagerly on the torch engine, in "
                             f"fp32 or bf16, to its final output; {name}={value!r} is not supported with it (for "
                             f"onnxruntime, export the network with dynamic batch and sequence axes and use "
                             f"ONNXModel with variableLength=True)")

    def _preprocessing(self) -> Any:
        """The images' preprocessing record (None: imagePreprocessing is empty)."""
        from irbis.models import preprocessing_for

        return preprocessing_for(self.getImagePreprocessing())

    def _row_shape(self) -> list[int] | None:
        preprocessing = self._preprocessing()
        return list(preprocessing.input_shape) if preprocessing is not None else super()._row_shape()

    def _validate_schema(self, schema: StructType) -> None:
        if self.isDefined(self.inputCols):
            self._validate_network_params()
            for col, shape in zip(self.getInputCols(), self.getInputShapes()):
                check_network_input(type(self).__name__, col, schema[col].dataType, shape)
            return None
        if not self.getImagePreprocessing():
            return super()._validate_schema(schema)
        self._validate_network_params()
        col = self.getInputCol()
        found = schema[col].dataType
        if not is_image_column(found):
            raise TypeError(f"TorchModel: column {col!r} has type {found.simpleString()}; with imagePreprocessing "
                            f"it must hold images: a Spark image struct or encoded image files (binary)")

    def _transform_spark(self, df: DataFrame) -> DataFrame:
        out = super()._transform_spark(df)
        if self.getVariableLength():
            return out
        export_ahead_of_job(df, resolve_source(self.getNetwork()), self._row_shape(), **self._network_options())
        return out

    def _network_options(self) -> dict[str, Any]:
        """How the network is loaded and run (the options the workers and the export ahead share)."""
        return dict(output_layer=self.getOutputLayer() or None, device=self.getDevice(), precision=self.getPrecision(),
                    engine=self.getEngine(), allow_pickle=self.getOrDefault(self.allowPickle))

    def _make_batch_fn(self) -> BatchFn:
        self._validate_network_params()
        return self._kernel()

    def _kernel(self) -> NetworkKernel:
        """The stage's kernel (:class:`irbis.kernels.inference.NetworkKernel`), a value the Spark runner ships
        with the network's files."""
        sequence = dict(device=self.getDevice(), precision=self.getPrecision(),
                        allow_pickle=self.getOrDefault(self.allowPickle), token_budget=self.getTokenBudget(),
                        max_rows=self.getMiniBatchSize()) if self.getVariableLength() else None
        options = dict(self._network_options(), batch_size=self.getMiniBatchSize(),
                       calibration_data=self.getCalibrationData())
        cols = tuple(self.getInputCols()) if self.isDefined(self.inputCols) else ()
        shapes = tuple(tuple(s) for s in self.getInputShapes()) if cols else ()
        return NetworkKernel(resolve_source(self.getNetwork()), cols[0] if cols else self.getInputCol(),
                             self.getOutputCol(), options, error_col=self.getErrorCol(), stage=type(self).__name__,
                             shape=self._row_shape(), input_dtype=self.getInputDtype(),
                             preprocessing=self._preprocessing(), sequence=sequence, columns=cols, shapes=shapes)

    def _network_rows(self, block: Any) -> np.ndarray:
        return self._kernel().convert(block)[0]

    # -- persistence -----------------------------------------------------------------------------
    def _save_extra(self, path: str) -> None:
        save_network_files(resolve_source(self.getNetwork()), path, self.training_summary)
        self._save_calibration(path)

    def _load_extra(self, path: str) -> None:
        network, self.training_summary = load_network_files(path)
        if network is not None:
            self._set(network=network)
        self._load_calibration(path)


def _split_inputs(module: nn.Module, params: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """A network of several inputs (``inputCols``, ``inputShapes``) as one of one flat row (:class:`SplitInputs`),
    and the Params with ``inputShape`` its width."""
    from irbis.train.networks import SplitInputs

    cols, shapes = params["inputCols"], params.get("inputShapes")
    if shapes is None and isinstance(module, SplitInputs):
        shapes = module.shapes
    if shapes is None or len(shapes) != len(cols):
        raise ValueError(f"TorchModel.from_module: inputCols {cols} needs inputShapes, one row shape per column "
                         f"(e.g. [[4], [3, 8, 8]]), found {shapes}")
    if not isinstance(module, SplitInputs):
        module = SplitInputs(module, shapes)
    elif module.shapes != [list(s) for s in shapes]:
        raise ValueError(f"TorchModel.from_module: inputShapes {shapes} differ from the network's {module.shapes}")
    return module, {**params, "inputShapes": [list(s) for s in shapes], "inputShape": [sum(module.widths)]}


def recorded_input_shape(module: nn.Module) -> list[int] | None:
    """The row shape a network surely takes when it starts with a Linear layer (after an optional
    Flatten) in a Sequential: ``[in_features]``; None when the shape cannot be told from the module."""
    layers = list(module.children()) if isinstance(module, nn.Sequential) else [module]
    if layers and isinstance(layers[0], nn.Flatten):
        layers = layers[1:]
    return [layers[0].in_features] if layers and isinstance(layers[0], nn.Linear) else None
