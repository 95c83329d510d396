"""Batch scoring that survives the death of its driver: :func:`score`.

The input (a folder of images, Parquet or CSV files of texts or vectors, a folder of ``.txt`` files) is split
once into *units*, groups of whole input files, and the plan is kept in ``OUTPUT/_irbis_score/plan`` (one
line of JSON: each unit's files with their sizes and modification times). Each unit is then one Spark write
of the fitted pipeline's output to ``OUTPUT/unit=<k>/``, committed all or nothing by Spark's own commit
protocol (its tasks write in a hidden ``_temporary`` folder, the job's commit moves their files into place);
once that write has returned, a marker ``OUTPUT/_irbis_score/done/unit=<k>/``, a second small write,
records the unit as done. Several units run at once from driver threads, so that the cores stay busy while
one unit's job starts or commits, and a unit's tasks share the cores when it runs alone.

Run again with ``resume=True``, only the units without a marker run: a unit whose write was cut short is
written again over what it left (Spark's ``overwrite`` mode removes it first). Read as one Parquet dataset,
``OUTPUT`` then holds the rows of one complete run, no row twice and none missing, with the column ``unit``
(the unit that scored the row) from the folder names. The ``_irbis_score`` folder is hidden from Spark's
readers, as the ``_SUCCESS`` and ``_temporary`` ones are.

Everything goes through Spark (its writers and readers, and its Hadoop file system to remove a folder), so
that ``OUTPUT`` can be on any storage Spark writes.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from irbis.ml.persistence import remove_folder

__all__ = ["INPUT_KINDS", "ScoreResult", "score"]

#: The kinds of input :func:`score` reads, and the file name endings of each (lower case).
INPUT_KINDS: dict[str, tuple[str, ...]] = {
    "images": (".jpg", ".jpeg", ".png", ".bmp"),
    "parquet": (".parquet",),
    "csv": (".csv",),
    "text": (".txt",),
}
#: The folder of ``OUTPUT`` that holds the plan and the units' markers (hidden from Spark's readers).
STATE = "_irbis_score"
#: The version of the plan's layout.
PLAN_FORMAT = "irbis-score/1"
#: Units planned by default per unit that runs at once: a unit is two Spark jobs (its rows, its marker),
#: whose start and commit cost about a second on a busy machine, so that units are few; more of them lose
#: less when a run dies.
UNITS_PER_SLOT = 5
#: Input bytes of a unit by default, at most: a large input is split into units of about this size.
UNIT_BYTES = 256 * 2**20
_UNIT = re.compile(r"/unit=(\d+)/")


@dataclass(frozen=True)
class ScoreResult:
    """What one call of :func:`score` did.

    Attributes
    ----------
    output : str
        The output folder.
    units : int
        The units of the plan.
    scored : tuple of int
        The units this call scored (all of them on a first run; those missing on a resumed one).
    skipped : int
        The units already done before this call.
    seconds : float
        The call's duration.
    """

    output: str
    units: int
    scored: tuple[int, ...]
    skipped: int
    seconds: float


def score(pipeline: Any, input: str, output: str, *, resume: bool = False, mode: str = "errorifexists",
          kind: str = "auto", column: str = "text", pathGlobFilter: str | None = None,
          filesPerUnit: int | None = None, concurrency: int | None = None, showProgress: bool = True,
          spark: Any = None, afterUnit: Callable[[int], None] | None = None) -> ScoreResult:
    """Score every row of ``input`` with a fitted pipeline into ``output``, unit by unit, so that a run whose
    driver dies can be finished with ``resume=True`` (see the module's documentation).

    Parameters
    ----------
    pipeline : pyspark.ml.Transformer or str
        A fitted pipeline (any Transformer), or the folder of a saved ``PipelineModel``.
    input : str
        A folder (searched recursively) or a file, any filesystem Spark reads: images, Parquet or CSV files,
        or ``.txt`` files (one text per file).
    output : str
        The output folder, any filesystem Spark writes; read it as one Parquet dataset.
    resume : bool
        Finish the run that planned ``output``: score only the units without a completed output. The input
        must be the one planned (same files, sizes and modification times) and the pipeline the same stage.
    mode : str
        ``errorifexists`` (refuse an ``output`` that holds anything) or ``overwrite`` (remove it and start
        over), Spark's save modes.
    kind : str
        ``images``, ``parquet``, ``csv``, ``text`` (a folder of ``.txt`` files) or ``auto``: the kind of most
        files of ``input`` (by their endings).
    column : str
        The column of a ``.txt`` file's bytes (``text`` kind).
    pathGlobFilter : str, optional
        Only read the file names that match this glob (e.g. ``"*.jpg"``); by default those of ``kind``.
    filesPerUnit : int, optional
        The input files of a unit; by default the files are split by size into ``5 * concurrency`` units, or
        more of at most 256 MiB each (fewer where there are fewer files).
    concurrency : int, optional
        Units scored at once; the session's default parallelism by default.
    showProgress : bool
        Draw a progress bar of the files scored on the driver.
    spark : SparkSession, optional
        The session; the active one by default.
    afterUnit : callable, optional
        Called on the driver with each unit's number once it is done (for a test to stop a run part way).

    Returns
    -------
    ScoreResult
        The units planned and those scored by this call.

    Raises
    ------
    ValueError
        When ``output`` already holds something and neither ``resume`` nor ``mode="overwrite"`` is given,
        when both are, when the input changed since the plan, or when the pipeline writes a column ``unit``.

    Notes
    -----
    A unit is a group of whole files: one large Parquet file is one unit. Images are read with
    :func:`irbis.read_images` (files that cannot be decoded are left out, as ``irbis featurize`` does) and
    their ``image`` column is not written (``path`` names each one). The column types of a CSV input are
    inferred once, when the run is planned, and every unit is read with them.
    """
    from irbis.spark.resources import default_parallelism
    from irbis.spark.session import active_session

    start = time.perf_counter()
    if mode not in ("errorifexists", "overwrite"):
        raise ValueError(f"mode must be errorifexists or overwrite, not {mode!r}")
    if resume and mode == "overwrite":
        raise ValueError("give resume (finish the run in the output) or mode='overwrite' (start it again), "
                         "not both")
    if kind != "auto" and kind not in INPUT_KINDS:
        raise ValueError(f"kind must be auto or one of {', '.join(INPUT_KINDS)}, not {kind!r}")
    if filesPerUnit is not None and filesPerUnit < 1:
        raise ValueError(f"filesPerUnit must be at least 1, found {filesPerUnit}")
    spark = spark or active_session("score")
    model = _load_pipeline(pipeline)
    output = output.rstrip("/")
    slots = concurrency or default_parallelism(spark)
    if slots < 1:
        raise ValueError(f"concurrency must be at least 1, found {concurrency}")

    if mode == "overwrite":
        remove_folder(spark, output, "mode='overwrite'")
    plan = None if mode == "overwrite" else _read_plan(spark, output)
    if plan is None and mode != "overwrite" and _files(spark, output):
        raise ValueError(f"{output} already holds files that no run of irbis score planned: choose another "
                         "output, or replace it with --mode overwrite (mode='overwrite')")
    if plan is not None and not resume:
        raise ValueError(f"{output} already holds a run of irbis score: finish it with --resume (resume=True), "
                         "or start again with --mode overwrite (mode='overwrite')")

    if plan is None:
        kind, files = _list_input(spark, input, kind, pathGlobFilter)
        plan = _new_plan(spark, model, input, files, kind, column, pathGlobFilter, filesPerUnit or 0, slots)
        first = _written(model.transform(_reader(spark, plan)(plan["units"][0]["files"])), plan)
        if "unit" in first.columns:
            raise ValueError("the pipeline writes a column 'unit', which names the output's unit folders: "
                             "rename it (e.g. with a SQLTransformer) before scoring")
        _write_text(spark, f"{output}/{STATE}/plan", json.dumps(plan))
    else:
        _check_unchanged(plan, model, input, _list_input(spark, input, plan["kind"], plan["glob"])[1], output)

    done = _done_units(spark, output)
    todo = [unit for unit in plan["units"] if unit["unit"] not in done]
    total = sum(len(unit["files"]) for unit in plan["units"])
    scored = _run_units(spark, model, plan, output, todo, slots, total, showProgress, afterUnit)
    return ScoreResult(output, len(plan["units"]), tuple(scored), len(plan["units"]) - len(todo),
                       time.perf_counter() - start)


def _load_pipeline(pipeline: Any) -> Any:
    """``pipeline`` itself, or the ``PipelineModel`` saved in the folder it names."""
    if isinstance(pipeline, str):
        from pyspark.ml import PipelineModel

        return PipelineModel.load(pipeline)
    if not callable(getattr(pipeline, "transform", None)):
        raise TypeError(f"pipeline must be a fitted pipeline (a Transformer) or the folder of a saved "
                        f"PipelineModel, not {type(pipeline).__name__}")
    return pipeline


def _files(spark: Any, path: str) -> list[str] | None:
    """The files under ``path`` that Spark's readers see (its listing: no content is read), or None where
    ``path`` does not exist."""
    from pyspark.errors import AnalysisException

    reader = spark.read.format("binaryFile").option("recursiveFileLookup", "true")
    try:
        # the path twice (Spark lists it once): a single path that does not exist costs a logged JVM stack
        # trace (Spark's look for a streaming sink's metadata) before the error
        return list(reader.load([path, path]).inputFiles())
    except AnalysisException as err:
        if "PATH_NOT_FOUND" in str(err):
            return None
        raise


def _read_plan(spark: Any, output: str) -> dict[str, Any] | None:
    """The plan kept in ``output``, or None where there is none."""
    files = _files(spark, f"{output}/{STATE}/plan")
    if not files:
        return None  # none, or a plan whose write was cut short: nothing was scored after it
    rows = spark.read.option("wholetext", True).text(files).collect()
    plan: dict[str, Any] = json.loads(rows[0][0])
    if plan.get("format") != PLAN_FORMAT:
        raise ValueError(f"{output}/{STATE}/plan is not a plan of this version of irbis score "
                         f"({plan.get('format')!r}, expected {PLAN_FORMAT!r})")
    return plan


def _done_units(spark: Any, output: str) -> set[int]:
    """The units of ``output`` with a marker: their output was written whole."""
    paths = _files(spark, f"{output}/{STATE}/done") or []
    return {int(match.group(1)) for path in paths if (match := _UNIT.search(path))}


def _write_text(spark: Any, path: str, text: str) -> None:
    """Write ``text`` as the one line of a text dataset at ``path`` (committed whole by Spark)."""
    spark.createDataFrame([(text,)], "value string").coalesce(1).write.mode("overwrite").text(path)


def _list_input(spark: Any, source: str, kind: str, glob: str | None) -> tuple[str, list[dict[str, Any]]]:
    """The kind of ``source`` (``kind`` itself unless ``auto``) and its files of that kind (Spark's listing,
    by path): path, size in bytes and modification time (ms). No file content is read."""
    reader = spark.read.format("binaryFile").option("recursiveFileLookup", "true")
    if glob:
        reader = reader.option("pathGlobFilter", glob)
    rows = (reader.load(source).selectExpr("path", "length", "unix_millis(modificationTime) as mtime")
            .collect())
    files = sorted(({"path": r.path, "size": int(r.length), "mtime": int(r.mtime)} for r in rows),
                   key=lambda f: f["path"])
    if kind == "auto":
        counts = {k: sum(f["path"].lower().endswith(ends) for f in files) for k, ends in INPUT_KINDS.items()}
        kind = max(counts, key=lambda k: counts[k])
        if not counts[kind]:
            raise ValueError(f"{source} holds no images, Parquet, CSV or .txt files (by their endings); name "
                             "the kind with --input-format (kind=...)")
    if not glob:
        files = [f for f in files if f["path"].lower().endswith(INPUT_KINDS[kind])]
    if not files:
        raise ValueError(f"{source} holds no {kind} files" + (f" matching {glob!r}" if glob else ""))
    return kind, files


def _new_plan(spark: Any, model: Any, source: str, listed: list[dict[str, Any]], kind: str, column: str,
              glob: str | None, per_unit: int, slots: int) -> dict[str, Any]:
    """The plan of a new run: the units (consecutive files, of about equal bytes) and what reads them."""
    from irbis.spark.tables import read_table

    if per_unit:
        groups = [listed[i:i + per_unit] for i in range(0, len(listed), per_unit)]
    else:
        size = sum(f["size"] for f in listed)
        groups = _split_by_size(listed, min(len(listed), max(UNITS_PER_SLOT * slots, -(-size // UNIT_BYTES))))
    partitioned = any("=" in segment for f in listed for segment in f["path"].split("/")[:-1])
    plan: dict[str, Any] = {
        "format": PLAN_FORMAT, "input": source, "kind": kind, "glob": glob, "column": column, "pipeline": model.uid,
        "basePath": source if partitioned and kind in ("parquet", "csv") else None,
        "units": [{"unit": k, "files": group} for k, group in enumerate(groups)],
    }
    if kind == "csv":  # one schema for every unit: a CSV's types are inferred once
        plan["schema"] = read_table(spark, [f["path"] for f in listed], kind, column,
                                    base_path=plan["basePath"]).schema.json()
    return plan


def _split_by_size(files: list[dict[str, Any]], units: int) -> list[list[dict[str, Any]]]:
    """``files`` in ``units`` runs of consecutive files of about equal bytes (each at least one file)."""
    # a file counts its bytes plus Spark's cost of opening one (4 MiB), so that small files split by count
    weights = [f["size"] + 4 * 2**20 for f in files]
    share, acc = sum(weights) / units, 0.0
    groups: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for i, (file, weight) in enumerate(zip(files, weights)):
        current.append(file)
        acc += weight
        left_files, left_units = len(files) - i - 1, units - len(groups) - 1
        if left_units and (acc >= share * (len(groups) + 1) or left_files == left_units):
            groups.append(current)
            current = []
    return groups + ([current] if current else [])


def _check_unchanged(plan: dict[str, Any], model: Any, source: str, files: list[dict[str, Any]],
                     output: str) -> None:
    """Refuse to resume ``plan`` where the input or the pipeline is not the planned one."""
    again = "score it into a new output, or start again with --mode overwrite (mode='overwrite')"
    if plan["pipeline"] != model.uid:
        raise ValueError(f"{output} was planned for the pipeline {plan['pipeline']}, not {model.uid}: resume "
                         f"with the planned pipeline, or {again}")
    planned = {f["path"]: f for unit in plan["units"] for f in unit["files"]}
    now = {f["path"]: f for f in files}
    changes = [f"{p} was {planned[p]['size']} bytes modified at {planned[p]['mtime']} ms, now {now[p]['size']} "
               f"bytes modified at {now[p]['mtime']} ms" for p in sorted(planned.keys() & now.keys())
               if (planned[p]["size"], planned[p]["mtime"]) != (now[p]["size"], now[p]["mtime"])]
    changes += [f"{p} is gone" for p in sorted(planned.keys() - now.keys())]
    changes += [f"{p} is new" for p in sorted(now.keys() - planned.keys())]
    if changes:
        more = f" (and {len(changes) - 3} more changes)" if len(changes) > 3 else ""
        raise ValueError(f"the input {source} changed since {output} was planned: {'; '.join(changes[:3])}{more}. "
                         f"Resuming would mix two inputs: {again}")


def _reader(spark: Any, plan: dict[str, Any]) -> Callable[[list[dict[str, Any]]], Any]:
    """A function from a unit's files to the DataFrame of their rows."""
    from pyspark.sql.types import StructType

    from irbis.spark.tables import read_table

    kind = plan["kind"]
    if kind == "images":
        from irbis.spark.images import read_images

        return lambda files: read_images([f["path"] for f in files], recursive=False, dropInvalid=True,
                                         spark=spark)
    schema = StructType.fromJson(json.loads(plan["schema"])) if plan.get("schema") else None
    return lambda files: read_table(spark, [f["path"] for f in files], kind, plan["column"], schema=schema,
                                    base_path=plan.get("basePath"))


def _written(frame: Any, plan: dict[str, Any]) -> Any:
    """What is written of the pipeline's output: all but the decoded ``image`` of an image input."""
    return frame.drop("image") if plan["kind"] == "images" else frame


def _run_units(spark: Any, model: Any, plan: dict[str, Any], output: str, todo: Sequence[dict[str, Any]],
               slots: int, total: int, show: bool, after: Callable[[int], None] | None) -> list[int]:
    """Score the units ``todo``, ``slots`` at a time; the numbers of those done, in the order they finished."""
    from tqdm.auto import tqdm

    read = _reader(spark, plan)
    done_files = total - sum(len(unit["files"]) for unit in todo)
    bar = tqdm(total=total, initial=done_files, desc="irbis score", unit="file", disable=not show, leave=True)
    finished: list[int] = []
    lock = threading.Lock()

    def run(unit: dict[str, Any]) -> int:
        k = unit["unit"]
        _written(model.transform(read(unit["files"])), plan).write.mode("overwrite").parquet(
            f"{output}/unit={k:05d}")
        _write_text(spark, f"{output}/{STATE}/done/unit={k:05d}", json.dumps({"unit": k}))
        with lock:
            finished.append(k)
            bar.update(len(unit["files"]))
            bar.set_postfix(units=f"{len(plan['units']) - len(todo) + len(finished)}/{len(plan['units'])}")
        return k

    pending = list(todo)
    try:
        with ThreadPoolExecutor(max_workers=slots, thread_name_prefix="irbis-score") as pool:
            running: set[Future[int]] = {pool.submit(run, pending.pop(0)) for _ in range(min(slots, len(pending)))}
            while running:
                complete, running = wait(running, return_when=FIRST_EXCEPTION)
                for future in complete:
                    k = future.result()  # a unit that failed stops the run: the others finish, none starts
                    if after is not None:
                        after(k)
                    if pending:
                        running.add(pool.submit(run, pending.pop(0)))
    finally:
        bar.close()
    return finished
