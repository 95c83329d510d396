"""``irbis serve``: a saved pipeline over HTTP, its kernels run with no Spark job per request."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    """Add ``serve`` to the sub-commands ``sub``."""
    serve = sub.add_parser("serve", help="serve a saved pipeline over HTTP (its kernels, no Spark job per request)",
                           description="Serve a saved PipelineModel (or one saved stage) over HTTP: POST /predict "
                           "takes a JSON object or array of objects keyed by the input columns (or image bytes), "
                           "and answers with the last stage's output columns (--outputs to choose). A body over "
                           "--max-body-bytes gets a 413 that the client reads even while it is still sending.")
    serve.add_argument("pipeline", help="folder of a saved PipelineModel or stage")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    serve.add_argument("--port", type=int, default=8080, help="with --replicas, 0 picks a free port per replica")
    serve.add_argument("--processes", type=int, default=1,
                       help="server processes (default 1, whose network takes every core; N: cores // N each)")
    serve.add_argument("--outputs", default=None, metavar="COLUMNS|all",
                       help="comma-separated output columns to answer with, or 'all' for every column the "
                       "pipeline writes (default: the last stage's output columns, e.g. a classifier's "
                       "rawPrediction, probability and prediction)")
    serve.add_argument("--token", default=None, help="bearer token for /predict (default: $IRBIS_SERVE_TOKEN)")
    serve.add_argument("--master", default=None, help="Spark master URL: serve stages without a kernel through "
                       "a Spark session on it (slower); with --replicas, the cluster to run on (default: none, no "
                       "Spark)")
    serve.add_argument("--replicas", type=int, default=0, help="servers to run on the --master executors")
    serve.add_argument("--addresses-file", default="irbis-serve-addresses.txt",
                       help="with --replicas: where the replicas' addresses are written")
    serve.add_argument("--max-batch-size", type=int, default=64, help="rows per pipeline call")
    serve.add_argument("--max-wait-ms", type=float, default=2.0, help="wait for more requests under load")
    serve.add_argument("--max-queue", type=int, default=1024, help="waiting requests before 503")
    serve.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024,
                       help="413 above this (the rest of the body is read and discarded, up to 4x this or 128 MiB "
                       "and 2 s, so that a client still sending reads the 413)")
    serve.add_argument("--timeout", type=float, default=30.0, help="seconds per request before 504")
    serve.add_argument("--length-groups", action="store_true",
                       help="text pipelines: run the requests queued together in groups of like length, shortest "
                       "first, each answered when done (short requests answer sooner, long ones no sooner; off by "
                       "default: under closed-loop load it does not lower the p99, docs/serving.md)")
    serve.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve ``args.pipeline`` here, or as ``--replicas`` servers on the executors of ``--master``."""
    from irbis.serving.app import ServeOptions

    options = ServeOptions(max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
                           max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
                           timeout_s=args.timeout, token=args.token, length_groups=args.length_groups)
    outputs = [c for c in args.outputs.split(",") if c] if args.outputs else None
    if args.replicas:
        from irbis.serving.replicas import serve_on_spark

        if not args.master:
            raise ValueError("--replicas needs --master MASTER: the replicas run on its executors")
        serve_on_spark(args.pipeline, args.master, args.replicas, host=args.host, port=args.port, outputs=outputs,
                       options=options, addresses_file=args.addresses_file)
        return 0
    from irbis.serving.server import serve

    print(f"serving {args.pipeline} on http://{args.host}:{args.port} (POST /predict; GET /health, /ready, "
          f"/metrics, /openapi.json)", flush=True)
    serve(args.pipeline, host=args.host, port=args.port, workers=args.processes, outputs=outputs,
          spark=args.master, options=options)
    return 0
