"""What ``irbis serve``'s length groups give a drain of text requests, measured outside the server.

Without groups, the batcher hands every request of one queue drain to the pipeline in one call, and the text
stage's kernel sorts the texts of that call by length and cuts them by ``tokenBudget``
(:mod:`irbis.kernels.sequences`). With them (``irbis serve --length-groups``), the drain is split into
length groups, shortest first, one pipeline call each (:meth:`irbis.serving.predictor.Predictor.length_groups`,
the stage's tokens and budget), and each group is answered as soon as it is done. This measures both on drains
of ``--requests`` single-review requests (real drug reviews, drawn at random) through a ``TextEmbedder``
kernel (all-MiniLM-L6-v2, eager torch, for each of ``--budgets``): the time to answer the whole drain, and the
mean time a request waits for its answer.

Usage: ``python benchmarks/serve_text_groups.py [--requests 16] [--drains 20]``; writes
``results/serve_text_groups.txt``.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from provenance import Run

ROOT = Path(__file__).resolve().parents[1]
#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16, help="single-review requests per queue drain")
    parser.add_argument("--drains", type=int, default=20, help="drains timed (after one untimed)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 4096],
                        help="the stage's tokenBudget (its batches' and its length groups'); 1024 is the default")
    args = parser.parse_args()

    from irbis.demo.reviews import drug_reviews
    from irbis.kernels.chain import KernelChain
    from irbis.ml import TextEmbedder
    from irbis.serving.predictor import Predictor

    texts = drug_reviews()["review"].tolist()
    rng = np.random.default_rng(0)
    rows: dict[str, list[tuple[float, float]]] = {}
    predictors = {budget: Predictor(KernelChain([TextEmbedder(inputCol="review", outputCol="e", engine="torch",
                                                              tokenBudget=budget).kernel()]))
                  for budget in args.budgets}
    for predictor in predictors.values():
        predictor.predict({"review": texts[:32]})  # untimed: loading
    run = Run(__file__, packages=("torch", "tokenizers", "numpy"))
    for _ in range(args.drains):
        drain = [texts[i] for i in rng.choice(len(texts), args.requests, replace=False)]
        requests = [{"review": [t]} for t in drain]
        for budget, predictor in predictors.items():
            start = time.perf_counter()
            predictor.predict({"review": drain})
            total = time.perf_counter() - start
            rows.setdefault(f"one call per drain, budget {budget}", []).append((total, total))
            start, answered = time.perf_counter(), []
            for group in predictor.length_groups(requests):
                predictor.predict({"review": [drain[i] for i in group]})
                answered += [time.perf_counter() - start] * len(group)
            rows.setdefault(f"length groups, budget {budget}", []).append((answered[-1], float(np.mean(answered))))
    lines = [*run.header(f"{args.drains} drains of {args.requests} single-review requests, TextEmbedder "
                         "(all_minilm_l6_v2, torch)"),
             "", "| batcher | drain answered (s) | mean wait of a request (s) |", "|---|---|---|"]
    for name, values in rows.items():
        total, mean = np.array(values).mean(axis=0)
        lines.append(f"| {name} | {total:.3f} | {mean:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (ROOT / "benchmarks" / "results" / "serve_text_groups.txt").write_text(text)


if __name__ == "__main__":
    main()
