"""The headline of every benchmark in one table and one plot, read from the results files (no measuring here).

Each headline job names its results file, its baseline's row and Irbis's row in that file; this script finds
both rows, takes the figure of each (the first number after the row's label, or the one ``skip`` numbers
further on), and writes the ratio Irbis / baseline to ``results/summary.txt`` and a bar chart to
``results/summary.png`` (above 1: Irbis is faster). The baseline of each job is the strongest one that its run
measured on the same cores (a plain loop without Spark, a peer library, or PySpark's own tool): the README's
performance table quotes these rows, and ``docs/performance.md`` every other figure of the same files.

Run it after any benchmark whose file a job reads::

    python benchmarks/summary.py
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from provenance import Run  # noqa: E402

#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1
RESULTS = HERE / "results"
NUMBER = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])\d+(?:\.\d+)?(?:e[+-]?\d+)?")


@dataclass(frozen=True)
class Row:
    """A row of a results file: the ``nth`` line holding ``label`` (0 the first), its figure ``skip`` numbers on."""

    label: str
    nth: int = 0
    skip: int = 0


@dataclass(frozen=True)
class Job:
    name: str
    file: str
    unit: str
    baseline_name: str
    baseline: Row
    irbis_name: str
    irbis: Row


JOBS = [
    Job("image scoring, EfficientNet-Lite0", "inference_effnet.txt", "img/s",
        "plain ONNX Runtime loop, no Spark, 1 process x 2 threads", Row("(a1) plain ONNX Runtime, 1 proc x 2 threads"),
        "TorchModel fp32, engine auto", Row("(b) irbis TorchModel, local[2], fp32, engine=auto |")),
    Job("JPEG files to features", "images.txt", "img/s",
        "plain OpenCV + ONNX Runtime loop, no Spark", Row("(a3) plain, best engine"),
        "ImageFeaturizer fp32, one pass",
        Row("(b) binaryFile -> ImageFeaturizer (one pass), local[2], fp32, engine=auto")),
    Job("text embeddings, all-MiniLM-L6-v2", "text.txt", "texts/s",
        "plain tokenizers + OpenVINO loop, length-sorted",
        Row("(b) plain tokenizers + engine, sorted | openvino fp32"),
        "TextEmbedder fp32, one Parquet file as read", Row("(d) Irbis TextEmbedder | fp32, one Parquet file as read")),
    Job("fine-tuning MiniLM, reviews x8", "train_text.txt", "samples/s",
        "plain PyTorch loop, 1 process", Row("(a) plain PyTorch, 1 process x 2 threads", nth=1),
        "TextClassifier, 2 workers", Row("(c) TextClassifier, numWorkers=2", nth=1)),
    Job("fine-tuning EfficientNet-Lite0", "train_images.txt", "img/s",
        "TorchDistributor DDP, 2 processes", Row("(b) TorchDistributor DDP, 2 processes x 1"),
        "ImageClassifier on binaryFile", Row("(c) ImageClassifier, binaryFile")),
    Job("asynchronous training, digits MLP", "async_e2e.txt", "samples/s",
        "sparktorch hogwild", Row("sparktorch hogwild    ", nth=1, skip=1),
        "TorchEstimator downpour", Row("irbis downpour         ", nth=1, skip=1)),
    Job("LIME, EfficientNet-Lite0", "explain.txt", "images/s",
        "lime package, 2 processes", Row("(l2) lime package"),
        "ImageLIME", Row("(i) ImageLIME")),
    Job("text serving, 16 clients", "serving_text.txt", "req/s",
        "Starlette + sentence-transformers", Row("| baseline | 2 torch threads, pool | 16"),
        "irbis serve", Row("| irbis | --processes 1 | 16")),
]


def figure(text: str, row: Row, file: str) -> float:
    """The figure of ``row`` in ``text``; a missing row is an error that names the file and the label."""
    lines = [line for line in text.splitlines() if row.label in line and not line.startswith("#")]
    if len(lines) <= row.nth:
        raise SystemExit(f"{file}: no row {row.nth + 1} holding {row.label!r}")
    line = lines[row.nth]
    after = line[line.index(row.label) + len(row.label):]
    if line.lstrip().startswith("|"):  # a Markdown table: the numbers of the whole cells after the label's
        cells = after.split("|")[0 if row.label.rstrip().endswith("|") else 1:]
        numbers = [c.strip() for c in cells if NUMBER.fullmatch(c.strip())]
    else:
        numbers = NUMBER.findall(after)
    if len(numbers) <= row.skip:
        raise SystemExit(f"{file}: the row holding {row.label!r} has no figure {row.skip + 1}")
    return float(numbers[row.skip].replace(",", ""))


def summarise(results: Path = RESULTS) -> list[tuple[Job, float, float]]:
    """(job, baseline figure, Irbis figure) for each job."""
    out = []
    for job in JOBS:
        text = (results / job.file).read_text()
        out.append((job, figure(text, job.baseline, job.file), figure(text, job.irbis, job.file)))
    return out


def plot(rows: list[tuple[Job, float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [job.name for job, _, _ in rows][::-1]
    ratios = [irbis / base for _, base, irbis in rows][::-1]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.barh(names, ratios, color=["#3a7d44" if r >= 1 else "#c0504d" for r in ratios])
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlim(0.25, 12)
    ax.set_xticks([0.25, 0.5, 1, 2, 4, 8], ["0.25x", "0.5x", "1x", "2x", "4x", "8x"])
    ax.minorticks_off()
    ax.set_xlabel("Irbis / baseline, same run (log scale; right of 1x: Irbis is faster)")
    for y, r in enumerate(ratios):
        ax.text(r, y, f" {r:.2f}x", va="center")
    ax.set_title("Irbis against the strongest baseline of each run, 2 CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    run = Run(__file__, packages=("matplotlib",))
    rows = summarise()
    table = ["| job | baseline | baseline figure | Irbis | Irbis figure | unit | ratio | results file |",
             "|---|---|---|---|---|---|---|---|"]
    for job, base, irbis in rows:
        table.append(f"| {job.name} | {job.baseline_name} | {base:g} | {job.irbis_name} | {irbis:g} | {job.unit} "
                     f"| {irbis / base:.2f}x | {job.file} |")
    plot(rows, RESULTS / "summary.png")
    text = "\n".join(run.header("the headline row of each benchmark, read from its results file") + [""] + table)
    (RESULTS / "summary.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
