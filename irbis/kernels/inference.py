"""Network inference as a pure batch function: numpy in, numpy out.

``make_torch_predict_fn`` turns a JSON description of a network (a *source*) into an ``ArrayFn``, one
array of inputs to one array of outputs (a stage's kernel, :data:`irbis.kernels.blocks.BatchFn`, wraps
it over column blocks). It is called in every Python worker (Spark), server process or LIME loop; the
loaded network is cached per process, keyed by the source, the identity of its files, the device and
the precision, so a worker loads it once and stages that read different layers of it share it. Reading
an inner layer leaves the cached network as it was: the hook that stops the forward pass lives for one
call only.

Sources (plain dicts, so they cross the Params boundary as JSON):

* ``{"kind": "repository", "name": "efficientnet_lite0", "entry": {...}, "base": ...}``: a named model
  of the catalogue; the driver puts the whole entry in the source, so a worker needs no registry;
* ``{"kind": "bundle", "path": DIR}``: a folder with ``architecture.json`` (an
  :data:`irbis.models.ARCHITECTURES` name, or an importable ``class``, and its ``options``) and
  ``weights.pt`` (a state dict);
* ``{"kind": "exported", "path": FILE}``: a ``torch.export`` archive (``.pt2``), loaded as a module tree
  with its original names, so any inner module can be read;
* ``{"kind": "torchscript", "path": FILE}``: a TorchScript archive (whole outputs only).

Weights are shared between the processes of one machine: after a network is prepared for inference
(channels-last layout, reduced precision), its weights are written once to a cache file and every
process memory-maps that file, so N Python workers hold one copy of the weights, not N.

torch (and the model layer) are imported only on the paths that need them (the eager engine, and the
export of a network): a worker that runs an exported network found in the machine's cache never loads
torch, which saves its ~300 MiB of resident memory per Python worker.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import threading
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from irbis.kernels.calibration import Calibration, make_calibration
from irbis.kernels.device import task_device
from irbis.kernels.engines import (
    EngineError,
    cached,
    cached_values,
    candidates,
    clear_cache,  # noqa: F401  (re-exported)
    exported_engine,
)
from irbis.kernels.engines.exported import Chain, ExportedNetwork, in_batches
from irbis.kernels.threads import set_threads, task_threads  # noqa: F401  (re-exported)
from irbis.models.fetch import cached_sha256

if TYPE_CHECKING:
    import torch
    from torch import nn

    from irbis.models import ModelRepository

#: A network's batch function: one array of inputs to one array of outputs.
ArrayFn = Callable[[np.ndarray], np.ndarray]
PRECISIONS = ("fp32", "bf16", "int8")



class _StopForward(Exception):
    """Raised by a forward hook to stop the network once the requested layer has run."""


def resolve_source(model_path: str, repository: ModelRepository | None = None) -> dict[str, Any]:
    """Describe ``model_path`` (a file, a bundle folder or a repository name) as a source dict."""
    from irbis.models import ModelRepository

    path = Path(model_path)
    if path.is_dir():
        if not (path / "architecture.json").is_file():
            raise FileNotFoundError(f"model folder {model_path} has no architecture.json")
        return {"kind": "bundle", "path": str(path.resolve())}
    if path.is_file():
        if path.suffix == ".onnx":
            raise ValueError(f"{model_path} is an ONNX graph; use irbis.ONNXModel for it")
        kind = "exported" if path.suffix == ".pt2" else "torchscript"
        return {"kind": kind, "path": str(path.resolve())}
    repo = repository or ModelRepository()
    names = [e.name for e in repo.entries()]
    if model_path in names:
        entry = repo.entry(model_path)
        return {"kind": "repository", "name": model_path, "entry": entry.to_dict(), "base": entry.base}
    raise FileNotFoundError(
        f"model {model_path!r} not found: no such file or folder, and no repository model of that "
        f"name (the repository has {names})"
    )


def source_identity(source: dict[str, Any]) -> str:
    """A short key of what ``source`` loads: its settings and the content of its files, not where they lie.

    The ONNX exports are keyed by it, so the same weights at another path (a stage saved and loaded again, a
    pipeline read back from storage) reuse the export the machine already has. Each file's sha256 is
    computed once per process (:func:`irbis.models.fetch.cached_sha256`)."""
    parts = [json.dumps({k: v for k, v in source.items() if k != "path"}, sort_keys=True)]
    if "path" in source:
        root = Path(source["path"])
        if root.is_dir():
            parts += [f"{f.relative_to(root).as_posix()}:{cached_sha256(f)}"
                      for f in sorted(root.rglob("*")) if f.is_file()]
        elif root.is_file():
            parts.append(f"{root.suffix}:{cached_sha256(root)}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def process_key(source: dict[str, Any], identity: str | None = None) -> str:
    """The key of ``source`` in a process's caches: its :func:`source_identity` (``identity`` when known) and
    its path, so a cached network loads again (an export of a new input shape) from the files it was first
    read from."""
    return f"{identity or source_identity(source)}|{source.get('path', '')}"


def load_network(source: dict[str, Any], allow_pickle: bool = False) -> nn.Module:
    """Load the network a source describes, in eval mode, on the CPU."""
    import torch

    from irbis.models import CatalogueEntry, ModelRepository, build_model, safe_load_state_dict
    from irbis.models.module_files import build_from_reference, load_exported

    kind = source["kind"]
    if kind == "repository":
        repo = ModelRepository()
        if "entry" in source:
            repo = ModelRepository(include_builtin=False)
            repo.register(CatalogueEntry.from_dict(source["entry"], base=source.get("base")))
        return repo.load_model(source["name"], allow_pickle=allow_pickle)
    path = Path(source["path"])
    if not path.exists():
        raise FileNotFoundError(f"model file not found: {path}")
    if kind == "exported":
        return load_exported(path).eval()
    if kind == "torchscript":
        try:
            return torch.jit.load(str(path), map_location="cpu").eval()
        except RuntimeError as e:
            raise ValueError(
                f"{path} is not a TorchScript archive ({e}). Give a TorchScript file, a model folder "
                f"with architecture.json + weights.pt, or a repository name."
            ) from e
    if kind == "bundle":
        arch = json.loads((path / "architecture.json").read_text())
        module = (build_from_reference(arch["class"], arch.get("options", {})) if "class" in arch
                  else build_model(arch["architecture"], **arch.get("options", {})))
        weights = safe_load_state_dict(path / "weights.pt", allow_pickle=allow_pickle)
        module.load_state_dict(weights, assign=True)
        return module.eval()
    raise ValueError(f"unknown model source kind {kind!r}; expected repository, bundle, exported or torchscript")


def prepare_network(module: nn.Module, precision: str, device: torch.device) -> nn.Module:
    """Make a network fast for inference: channels-last layout, frozen parameters.

    ``bf16`` is applied at run time by autocast (see :func:`make_torch_predict_fn`): matrix products
    and convolutions run in bfloat16 while weights stay fp32 (so they stay shared between processes)
    and numerically sensitive ops (reductions, softmax, batch norm) stay in fp32, which keeps top-1
    agreement with fp32 higher than casting the whole network; the first and last layers stay in fp32
    (:func:`keep_ends_in_fp32`). ``int8`` is not run eagerly: :func:`make_torch_predict_fn` runs it on the
    network's export.
    """
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "int8":
        raise ValueError("precision='int8' runs on the network's ONNX export, not eagerly; use make_torch_predict_fn")
    if isinstance(module, torch.jit.ScriptModule):
        return module.to(device)
    module.requires_grad_(False)
    module = module.to(device)
    if any(p.dim() == 4 for p in module.parameters()):
        module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs lack it
    if precision == "bf16":
        keep_ends_in_fp32(module)
    return module


def keep_ends_in_fp32(module: nn.Module) -> None:
    """Run the first and the last layer with weights outside autocast, in fp32.

    The usual mixed-precision practice: rounding the raw input to bfloat16 (8 bits of mantissa) in the
    first layer and the logits in the last one is where bf16 flips near-tied top-1 classes; both layers
    are a small part of the compute.
    """
    import torch

    layers = [m for m in module.modules() if next(m.parameters(recurse=False), None) is not None]
    for layer in {id(m): m for m in (layers[:1] + layers[-1:])}.values():
        forward = layer.forward

        def fp32_forward(*args: Any, _forward: Callable[..., Any] = forward, **kwargs: Any) -> Any:
            with torch.autocast(args[0].device.type if args and torch.is_tensor(args[0]) else "cpu", enabled=False):
                return _forward(*[a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args],
                                **kwargs)

        layer.forward = fp32_forward


def share_weights(module: nn.Module, key: str, cache_dir: Path | None = None) -> nn.Module:
    """Back the module's tensors by one memory-mapped file shared by every process of this machine.

    The file is written once (under a lock, atomically) and reused while it matches the prepared
    module tensor for tensor (names, dtypes, shapes, strides); a file that does not match (written by
    another preparation) is replaced.
    """
    import torch

    from irbis.models.fetch import atomic_path, default_cache_dir, file_lock

    if isinstance(module, torch.jit.ScriptModule):
        return module
    state = module.state_dict()
    if not state or any(not isinstance(t, torch.Tensor) or t.is_quantized or t.device.type != "cpu"
                        for t in state.values()):
        return module
    folder = (cache_dir or default_cache_dir()) / "prepared"
    path = folder / f"{key}.pt"
    with file_lock(folder / ".locks" / f"{key}.lock"):
        shared = torch.load(path, map_location="cpu", weights_only=True, mmap=True) if path.exists() else None
        if shared is None or not _same_layout(shared, state):
            with atomic_path(path) as tmp:
                torch.save(state, tmp)
            shared = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    module.load_state_dict(shared, assign=True)
    return module


def _same_layout(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].stride() == b[k].stride() for k in a
    )


#: What ``output_layer`` may be: the final output (None or empty), one inner module, or several of them.
Layers = str | tuple[str, ...] | list[str] | None


def unknown_layer_error(layer: str, names: list[str], param: str = "outputLayer") -> ValueError:
    """The error for a ``layer`` that is none of the module ``names``: it lists the nearest of them."""
    near = difflib.get_close_matches(layer, names, n=5, cutoff=0.4) or names[:10]
    return ValueError(f"{param} {layer!r} is not a module of the network; the nearest names: {near}")


def check_output_layer(module: nn.Module, layer: Layers) -> None:
    """Raise a clear error unless ``layer`` (None or empty: the output; or several names) names modules of the
    network."""
    import torch

    if not layer:
        return
    if isinstance(module, torch.jit.ScriptModule):
        raise ValueError(
            f"outputLayer {layer!r}: TorchScript networks cannot be cut at an inner layer. Save the network "
            f"as a torch.export archive, torch.export.save(torch.export.export(module, (example,)), "
            f"'network.pt2'), or build the stage with TorchModel.from_module(module, inputShape=[...])"
        )
    names = [n for n, _ in module.named_modules() if n]
    for one in [layer] if isinstance(layer, str) else layer:
        if one not in names:
            raise unknown_layer_error(one, names)


def run_to_layer(module: nn.Module, x: torch.Tensor, layer: Layers) -> torch.Tensor | list[torch.Tensor]:
    """The output of ``module`` (``layer`` None or empty) or of its inner module ``layer`` for ``x``;
    for several names (a tuple or list), the list of their outputs from the same forward pass.

    The forward pass stops once every requested layer has run. The hooks are registered for this call and
    removed in ``finally``, so a cached network shared by several stages is left as it was; callers sharing
    one module between threads hold a lock around the call (the hooks would be seen by the other thread).
    """
    if not layer:
        return module(x)
    layers = [layer] if isinstance(layer, str) else list(layer)
    captured: dict[str, torch.Tensor] = {}

    def hook(name: str, _m: nn.Module, _inputs: Any, output: Any) -> None:
        captured[name] = output[0] if isinstance(output, (tuple, list)) else output
        if len(captured) == len(set(layers)):
            raise _StopForward

    handles = [module.get_submodule(name).register_forward_hook(partial(hook, name)) for name in set(layers)]
    try:
        module(x)
    except _StopForward:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return captured[layer] if isinstance(layer, str) else [captured[name] for name in layers]


def make_torch_predict_fn(
    source: dict[str, Any],
    *,
    output_layer: Layers = None,
    batch_size: int = 64,
    device: str = "cpu",
    precision: str = "fp32",
    allow_pickle: bool = False,
    engine: str = "torch",
    calibration_data: str = "",
) -> Callable[[np.ndarray], Any]:
    """Return ``fn(x) -> y``: ``x`` of shape (N, *input) float32, ``y`` of shape (N, D) float32.

    The network is loaded and prepared once per process and cached (one copy for every output layer);
    ``y`` holds the final output, or the output of the module named ``output_layer``, flattened per row.
    With several names (a tuple or list) ``y`` is a dict ``{name: (N, D_name)}``, all from one forward pass.
    ``engine`` (:data:`irbis.kernels.engines.ENGINE_NAMES`) runs it eagerly (``torch``), or exports it
    once per machine to ONNX, cut at ``output_layer``, for ONNX Runtime or OpenVINO; ``auto`` takes the
    first engine of :func:`irbis.kernels.engines.auto_order` that runs the network. For int8 on an exported
    engine, ``calibration_data`` is the folder of the calibration sample (:mod:`irbis.kernels.calibration`);
    int8 on ``torch`` quantises the fully connected layers dynamically and runs on the export too
    (:func:`irbis.kernels.engines.exported_engine`).

    Examples
    --------
    >>> fn = make_torch_predict_fn({"kind": "repository", "name": "efficientnet_lite0"})  # doctest: +SKIP
    >>> fn(np.zeros((2, 3, 224, 224), np.float32)).shape                                  # doctest: +SKIP
    (2, 1000)
    """
    identity, threads = source_identity(source), task_threads()
    place = process_key(source, identity)
    device = task_device(device)  # this task's device (the one device rule): "cpu" or "cuda:N"

    def getter(name: str) -> Callable[[], Any]:
        runner = exported_engine(name, precision)
        parts = [place, device, precision, allow_pickle] + ([] if runner is None else
                                                               [name, output_layer, threads, calibration_data])
        key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]
        if runner is None:
            return lambda: cached(key, lambda: _Network(source, key, device, precision, allow_pickle))
        if runner != name and device != "cpu":
            raise ValueError("precision='int8' runs on the CPU only; use bf16 on a GPU")
        load = partial(_load_for_export, source, allow_pickle, output_layer)
        calibration = partial(_calibration, source, calibration_data) if runner == name else None
        layers = tuple(output_layer) if isinstance(output_layer, list) else output_layer
        return lambda: cached(key, lambda: ExportedNetwork(load, identity, runner, layers,
                                                             device, precision, threads, calibration))

    if output_layer and not isinstance(output_layer, str):
        output_layer = tuple(output_layer)
    chain = Chain([(name, getter(name)) for name in candidates(engine, device, precision)], engine)
    if engine == "torch" and exported_engine(engine, precision) is None:
        check_output_layer(chain.networks[0][1]().module, output_layer)
    if isinstance(output_layer, tuple):
        return lambda x: dict(zip(output_layer, chain.predict(x, batch_size, output_layer)))
    return lambda x: chain.predict(x, batch_size, output_layer)


class CachedPredictor:
    """:func:`make_torch_predict_fn`'s function for ``source`` and ``options``, taken from the process's one
    predictor cache, keyed by what makes a predictor differ: the source and its files, the options, and
    the thread count that the runner set (:func:`set_threads`). Picklable; called like the function.

    Every network stage's kernel calls it on each batch, so each Spark task, server or LIME loop of a
    process shares one predictor (and its engine's session) per network, options and thread count. The
    part of the key that reads the source's files is worked out once per process, at the first call.
    """

    def __init__(self, source: dict[str, Any], **options: Any) -> None:
        self.source, self.options = source, options
        self._key: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "options": self.options, "_key": None}

    def __call__(self, x: np.ndarray) -> Any:
        if self._key is None:
            self._key = json.dumps(["predict", process_key(self.source), self.options], sort_keys=True,
                                   default=str)
        key = f"{self._key}|{task_threads()}"
        return cached(key, lambda: make_torch_predict_fn(self.source, **self.options))(x)


def cached_predict_fn(source: dict[str, Any], **options: Any) -> CachedPredictor:
    """The :class:`CachedPredictor` of ``source`` and ``options``."""
    return CachedPredictor(source, **options)


class _Network:
    """A loaded, prepared eager network of the per-process cache, run by one thread at a time."""

    engine = "torch"

    def __init__(self, source: dict[str, Any], key: str, device: str, precision: str, allow_pickle: bool) -> None:
        import torch

        self.device = torch.device(task_device(device))
        self.module = prepare_network(load_network(source, allow_pickle), precision, self.device)
        if self.device.type == "cpu":
            self.module = share_weights(self.module, key)
        self.autocast = precision == "bf16"
        self.lock = threading.Lock()

    def predict(self, x: np.ndarray, batch_size: int, layer: Layers) -> np.ndarray | list[np.ndarray]:
        import torch

        check_output_layer(self.module, layer)
        set_threads(task_threads())
        # torch warns on read-only (Arrow-backed) arrays: those are copied, others pass as they are
        x = np.require(x, np.float32, ["C", "W"])
        with self.lock, torch.inference_mode():
            return in_batches(lambda b: self._run(b, layer), x, batch_size)

    def _run(self, x: np.ndarray, layer: Layers) -> np.ndarray | list[np.ndarray]:
        import torch

        batch = torch.from_numpy(x).to(self.device)
        if batch.dim() == 4:
            batch = batch.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            out = run_to_layer(self.module, batch, layer)
        if isinstance(out, list):
            return [o.float().cpu().numpy() for o in out]
        return out.float().cpu().numpy()


def make_sequence_predict_fn(source: dict[str, Any], *, device: str = "cpu", precision: str = "fp32",
                             allow_pickle: bool = False, token_budget: int = 4096,
                             max_rows: int = 64) -> Callable[[list[np.ndarray]], np.ndarray]:
    """Return ``fn(rows) -> outputs``: a network run eagerly over variable-length rows, one output per row.

    ``rows`` are 1-d integer arrays (token ids) or ``(steps, features)`` float arrays, each at least one
    long. They run in length-aware batches (:func:`irbis.kernels.sequences.run_by_length`: sorted by length,
    cut under ``token_budget`` padded tokens and ``max_rows`` rows, padded to a multiple of 8) and are
    fed as the network's ``input_kind`` attribute says: ``"padded"`` (the default) calls ``module(x, mask)``
    with ``x`` int64 ``(B, T)`` (or float32 ``(B, T, F)``) padded with 0 and ``mask`` int64 ``(B, T)``, 1 on
    real steps; ``"packed"`` calls ``module(packed)`` with the ``PackedSequence`` of ``x`` and the lengths.
    The network must give one output per row (e.g. ``(B, C)`` logits); a per-step output (``(B, T, ...)``,
    or a ``PackedSequence``) raises ``ValueError``: pool the steps inside the network.
    """
    from irbis.kernels.sequences import check_row_output, input_kind, run_by_length

    parts = [process_key(source), device, precision, allow_pickle]
    key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]
    network = cached(key, lambda: _Network(source, key, device, precision, allow_pickle))
    kind = input_kind(network.module)

    def run(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import torch
        from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

        batch = torch.from_numpy(x).to(network.device)
        with torch.autocast(network.device.type, dtype=torch.bfloat16, enabled=network.autocast):
            if kind == "packed":
                lengths = torch.from_numpy(mask.sum(axis=1))
                out = network.module(pack_padded_sequence(batch, lengths, batch_first=True, enforce_sorted=False))
            else:
                out = network.module(batch, torch.from_numpy(mask).to(network.device))
        if isinstance(out, (tuple, list)):
            out = out[0]
        per_step = isinstance(out, PackedSequence)  # a packed output holds one value per step
        check_row_output((*x.shape[:2], -1) if per_step else tuple(out.shape), x.shape[0], x.shape[1])
        return out.float().cpu().numpy()

    def predict(rows: list[np.ndarray]) -> np.ndarray:
        import torch

        set_threads(task_threads())
        with network.lock, torch.inference_mode():
            return run_by_length(rows, run, token_budget=token_budget, max_rows=max_rows)[0]

    return predict


class _ShipsNetworkFile:
    """What a kernel of a network ``source`` tells the Spark runner (:func:`irbis.spark.files.shipped_kernel`):
    the network's local file or folder, and the kernel reading it where a shipped copy landed."""

    source: dict[str, Any]

    @property
    def files(self) -> tuple[str, ...]:
        """The local file or folder the kernel reads (none for a network of the repository)."""
        return (self.source["path"],) if "path" in self.source else ()

    def relocated(self, paths: dict[str, str]) -> Any:
        """This kernel reading its network at ``paths[path]`` (a copy shipped to this machine)."""
        if "path" not in self.source:
            return self
        path = paths.get(self.source["path"], self.source["path"])
        return replace(self, source=dict(self.source, path=path))  # type: ignore[type-var]  # each user is a dataclass


@dataclass(frozen=True)
class NetworkKernel(_ShipsNetworkFile):
    """TorchModel's kernel as a plain, picklable value: the network's source, how it runs, and the columns;
    called on a dict of column blocks, it gives the output blocks.

    The rows of ``column`` become the network's batch as :meth:`convert` says (images decoded and prepared
    with ``preprocessing``, or tensors of row ``shape`` read as ``input_dtype``) and run through the process's
    predictor of ``source`` and ``options`` (:func:`cached_predict_fn`); with ``sequence`` (``token_budget``
    and ``max_rows``), the column's variable-length rows run in length-aware batches instead
    (:func:`make_sequence_predict_fn`). With ``columns`` (several input columns, rows of ``shapes``) each
    column is read as one column is, and the network gets the rows valid in all of them as one flat row of
    their values side by side (:meth:`joined`; a network trained on several columns cuts it apart).
    :attr:`files` names the network's file or folder, which a runner that
    moves the kernel to another machine rewrites with :meth:`relocated`.
    """

    source: dict[str, Any]
    column: str
    output: str
    options: dict[str, Any]
    error_col: str = ""
    stage: str = "TorchModel"
    shape: list[int] | None = None
    input_dtype: str = "float32"
    preprocessing: Any = None
    sequence: dict[str, Any] | None = None
    columns: tuple[str, ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()

    def convert(self, block: Any, raise_errors: bool = True) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
        """The network's batch of a column block (values, valid, errors): the rows' values (images decoded and
        preprocessed), which rows they are, and why a non-null row has none (images only)."""
        from irbis.kernels.batching import network_batch
        from irbis.kernels.image.network_input import image_batch

        if self.preprocessing is not None:
            return image_batch(block, self.preprocessing, raise_errors)
        batch = network_batch(block, self.column, self.shape, input_dtype=self.input_dtype, stage=self.stage)
        return batch.values, batch.valid, [None] * len(batch.valid)

    def joined(self, blocks: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """The blocks of ``columns`` as one batch of flat rows, their values side by side, and the rows
        valid (not null) in every column."""
        from irbis.kernels.batching import network_batch

        batches = [network_batch(blocks[c], c, list(s), input_dtype=self.input_dtype, stage=self.stage)
                   for c, s in zip(self.columns, self.shapes)]
        valid = np.logical_and.reduce([b.valid for b in batches])
        parts = [b.values[(np.cumsum(b.valid) - 1)[valid]].reshape(int(valid.sum()), -1) for b in batches]
        return np.concatenate(parts, axis=1), valid

    def __call__(self, blocks: dict[str, Any]) -> dict[str, Any]:
        from irbis.kernels.batching import refused_shape
        from irbis.kernels.blocks import Tensor, flat_rows

        if self.sequence is not None:
            return self._sequences(blocks)
        if self.columns:
            values, valid = self.joined(blocks)
            errors: list[str | None] = [None] * len(valid)
        else:
            values, valid, errors = self.convert(blocks[self.column], not self.error_col)
        try:
            out = cached_predict_fn(self.source, **self.options)(values) if len(values) else None
        except EngineError:
            raise
        except RuntimeError as err:  # the eager network's error, or InputShapeError of another engine
            raise refused_shape(self.stage, self.column, values.shape[1:], self.shape, err) from err
        result: dict[str, Any] = {self.output: Tensor(flat_rows(out), valid)}
        if self.error_col:
            result[self.error_col] = np.array([e if e else None if ok else "null row"
                                               for ok, e in zip(valid, errors)], object)
        return result

    def _sequences(self, blocks: dict[str, Any]) -> dict[str, Any]:
        from irbis.kernels.batching import sequence_rows
        from irbis.kernels.blocks import Tensor, flat_rows

        col = self.column
        rows, errors = sequence_rows(blocks[col], col)
        if not self.error_col:
            bad = next((i for i, e in enumerate(errors) if e and e != "null row"), None)
            if bad is not None:
                raise ValueError(f"{self.stage}: column {col!r} row {bad} has no usable sequence ({errors[bad]}); "
                                 f"set errorCol to give such rows a null output and a reason")
        valid = np.array([r is not None for r in rows], bool)
        out = None
        if valid.any():
            out = make_sequence_predict_fn(self.source, **(self.sequence or {}))([r for r in rows if r is not None])
        result: dict[str, Any] = {self.output: Tensor(flat_rows(out), valid)}
        if self.error_col:
            result[self.error_col] = np.array(errors, object)
        return result


@dataclass(frozen=True)
class ImageKernel(_ShipsNetworkFile):
    """ImageFeaturizer's and ImageClassifierModel's kernel as a plain, picklable value: the network's source,
    how it runs, how images become its batch, and which layer goes to which column; called on a dict of column
    blocks, it gives the output blocks.

    The images of ``column`` (structs or encoded files) are decoded and prepared with ``preprocessing``
    (:func:`irbis.kernels.image.network_input.image_batch`, at ``max_pixels`` and ``fast_decode``) and run once
    through the process's predictor of ``source`` and ``options`` (:func:`cached_predict_fn`), read at every
    layer of ``layers`` (``(layer, column)``; ``""`` is the network's output) when ``several``, else at the
    one layer the options name. With ``classes`` (the probability and prediction columns) the first output
    is a classifier's logits, whose softmax and most likely index (a double) go to those columns too.
    """

    source: dict[str, Any]
    column: str
    preprocessing: Any
    layers: tuple[tuple[str, str], ...]
    options: dict[str, Any]
    several: bool = False
    error_col: str = ""
    max_pixels: int | None = None
    fast_decode: bool = False
    classes: tuple[str, ...] = ()

    def convert(self, block: Any, raise_errors: bool = True) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
        """The network's batch of a column of images (values, valid, errors)."""
        from irbis.kernels.image.network_input import image_batch

        return image_batch(block, self.preprocessing, raise_errors, max_pixels=self.max_pixels,
                           fast_decode=self.fast_decode)

    def __call__(self, blocks: dict[str, Any]) -> dict[str, Any]:
        from irbis.kernels.blocks import Tensor, flat_rows

        batch, valid, errors = self.convert(blocks[self.column], not self.error_col)
        found = cached_predict_fn(self.source, **self.options)(batch) if len(batch) else None
        out: dict[str, Any] = {col: Tensor(flat_rows(found[layer] if self.several and found else found), valid)
                               for layer, col in self.layers}
        if self.classes:
            out.update(class_outputs(out[self.layers[0][1]], *self.classes))
        return {**out, self.error_col: errors} if self.error_col else out


def class_outputs(raw: Any, probability_col: str, prediction_col: str) -> dict[str, Any]:
    """A classifier's probability (the softmax of its logits ``raw``, a :class:`irbis.kernels.blocks.Tensor`,
    in the logits' float type) and prediction (the index of the largest logit, a double; None where the row
    has no output) columns; an empty name leaves its column out."""
    from irbis.kernels.blocks import Tensor
    from irbis.kernels.sparkml.predictors import softmax

    values = raw.values.astype(np.float64, copy=False)
    logits = values.reshape(len(values), -1) if values.size else np.zeros((len(values), 0))  # no row: no shape
    out: dict[str, Any] = {}
    if probability_col:
        out[probability_col] = Tensor(softmax(logits).astype(raw.values.dtype, copy=False), raw.valid)
    if prediction_col:
        pred = np.full(len(raw.valid), None, dtype=object)
        pred[raw.valid] = logits.argmax(axis=1).astype(np.float64) if len(logits) else []
        out[prediction_col] = pred.tolist() if not raw.valid.all() else pred.astype(np.float64)
    return out


def _load_for_export(source: dict[str, Any], allow_pickle: bool, layer: Layers) -> nn.Module:
    import torch

    module = load_network(source, allow_pickle)
    check_output_layer(module, layer)
    if isinstance(module, torch.jit.ScriptModule):
        raise EngineError("TorchScript networks cannot be exported to ONNX by torch.export; save the network "
                          "as a torch.export archive (.pt2) to run it on another engine")
    return module.requires_grad_(False)


def _calibration(source: dict[str, Any], folder: str) -> Calibration:
    """The int8 sample of ``folder``, or of the shipped photographs for a repository model."""
    from irbis.models import CatalogueEntry

    spec = CatalogueEntry.from_dict(source["entry"]).preprocessing if "entry" in source else None
    if not folder and spec is None:
        raise EngineError("precision='int8' on an exported engine needs calibrationData (a folder of .npy "
                          "arrays of input rows) for a network outside the repository")
    return make_calibration(folder, spec)


def cached_networks() -> list[nn.Module]:
    """The eager networks this process holds in its cache (to inspect them)."""
    return [network.module for network in cached_values() if isinstance(network, _Network)]

