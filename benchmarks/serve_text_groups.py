"""Should ``irbis serve``'s batcher cut a queue drain of text requests into length groups?

The batcher hands every request of one queue drain to the pipeline in one call, and the text stages' kernel
sorts the texts of that call by length and cuts them by ``tokenBudget`` (:mod:`irbis.kernels.sequences`). A
batcher that also split the drain into length groups, shortest first, one pipeline call each, would answer
the short requests as soon as their group is done instead of at the end of the drain, at the cost of more
calls. This measures both on drains of ``--requests`` single-review requests (real drug reviews, drawn at
random) through a ``TextEmbedder`` kernel (all-MiniLM-L6-v2, eager torch): the time to answer the whole
drain, and the mean time a request waits for its answer.

Usage: ``python benchmarks/serve_text_groups.py [--requests 16] [--drains 8]``; writes
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
MEASURING_CODE = 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16, help="single-review requests per queue drain")
    parser.add_argument("--drains", type=int, default=8, help="drains timed (after one untimed)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[4096, 1024],
                        help="token budgets of the length groups (a request counts ~4 characters a token)")
    args = parser.parse_args()

    from irbis.demo.reviews import drug_reviews
    from irbis.kernels.chain import KernelChain
    from irbis.kernels.sequences import length_batches
    from irbis.ml import TextEmbedder
    from irbis.serving.predictor import Predictor

    kernel = TextEmbedder(inputCol="review", outputCol="e", engine="torch").kernel()
    predictor = Predictor(KernelChain([kernel]))
    texts = drug_reviews()["review"].tolist()
    rng = np.random.default_rng(0)
    predictor.predict({"review": texts[:32]})  # untimed: loading
    rows: dict[str, list[tuple[float, float]]] = {"one call per drain": []}
    for budget in args.budgets:
        rows[f"length groups, budget {budget}"] = []
    run = Run(__file__, packages=("torch", "tokenizers", "numpy"))
    for _ in range(args.drains):
        drain = [texts[i] for i in rng.choice(len(texts), args.requests, replace=False)]
        start = time.perf_counter()
        predictor.predict({"review": drain})
        total = time.perf_counter() - start
        rows["one call per drain"].append((total, total))
        for budget in args.budgets:
            groups = length_batches(np.array([len(t) // 4 + 2 for t in drain]), token_budget=budget,
                                    max_rows=args.requests)
            start, answered = time.perf_counter(), []
            for group in groups:
                predictor.predict({"review": [drain[i] for i in group]})
                answered += [time.perf_counter() - start] * len(group)
            rows[f"length groups, budget {budget}"].append((answered[-1], float(np.mean(answered))))
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
