"""Project training throughput and staleness from 1 to 64 nodes with a discrete-event model.

The model (``scale_sim.py``) is driven by what this machine measures:

* the compute time of one training step (forward, backward, local optimizer step, one
  torch thread, batch 32) of the digits MLP and the small CNN;
* the bytes per step each collective strategy hands to its communicator (a short real
  run of ``sync``, ``model_averaging``, ``one_bit`` on two thread workers); the
  parameter-server strategies send their gradients to the shards and pull the weights
  every ``fetchEvery`` steps (4 bytes per parameter each way);
* the time a shard takes to apply one update, per parameter (Adagrad for ``downpour``
  and ``mixed``, the DC-ASGD rule for ``dcasgd``, RMSProp for the paper scenario).

It then varies the network (1, 10, 100 Gbit/s, 50 us per message), the number of nodes
(1..64), of shards (1..8), and where the shards run (on the workers, or on extra nodes).

The "paper scenario" re-creates the ICCS 2017 study's cluster from the figures it gives
(ResNet-50 with 25.5 M parameters, 4 K80 GPUs per node at 124.18 images/s together,
128 images per node and step, 56 Gbit/s InfiniBand, N-1 parameter servers, RMSProp on
the servers) and prints the projection beside its Tables 1 and 2 twice: with the
server's update as measured here, and with one server cost per parameter inferred
from the single row that one server bounds (Table 1, 4 workers + 1 PS), the other
rows then being predictions.

Run: ``python benchmarks/simulate_scale.py [--quick] [--out DIR]``; a full run into the default folder
writes ``benchmarks/results/simulate_scale.txt`` beside its figures.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from provenance import Run  # noqa: E402
from scale_sim import Scenario, percentiles, simulate  # noqa: E402

#: bump when the figures would change (see provenance.py)
MEASURING_CODE = 1
NODES = [1, 2, 4, 8, 16, 32, 64]
BANDWIDTHS = [1.0, 10.0, 100.0]
MODELS = {"mlp": ("mlp", {"in_features": 64, "hidden": 128, "out_features": 10}, [64]),
          "cnn": ("small_cnn", {"num_classes": 10, "width": 32}, [3, 32, 32])}
COLLECTIVES = {"sync": {}, "model_averaging": {"period": 4}, "one_bit": {}}
FETCH_EVERY = 1
GROUP = 4
PAPER = {"params": 25_500_000, "batch": 128, "one_node": 124.18, "gbit": 56.0,
         "table2": {1: 124.18, 2: 195.60, 4: 383.09, 8: 809.10},
         "table1": [("7 nodes (4 workers + 3 PS)", 4, 3, True, 396.62),
                    ("4 nodes (4 workers + 3 PS)", 4, 3, False, 374.73),
                    ("4 nodes (4 workers + 1 PS)", 4, 1, False, 292.22)]}


def step_time(name: str, steps: int, batch: int = 32) -> tuple[float, int]:
    """Seconds per training step of ``name`` on one torch thread, and its parameter count."""
    from irbis.train.networks import build_network, network_spec

    arch, options, shape = MODELS[name]
    torch.manual_seed(0)
    model = build_network(network_spec(arch, options)).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return float(np.median(times)), sum(p.numel() for p in model.parameters())


def collective_bytes(name: str, rows: int) -> dict[str, float]:
    """Bytes per step and worker that each collective strategy's communicator counted."""
    from sklearn.datasets import load_digits

    from irbis.train.backends.local import run_threads, shard_rows
    from irbis.train.loop import TrainSpec
    from irbis.train.networks import network_spec

    arch, options, shape = MODELS[name]
    x, y = load_digits(return_X_y=True)
    x = np.resize((x[:rows] / 16).astype(np.float32), (rows, int(np.prod(shape))))
    out = {}
    for strategy, opts in COLLECTIVES.items():
        spec = TrainSpec.of(network=network_spec(arch, options), epochs=4, batchSize=16, strategy=strategy,
                            strategyOptions=opts, inputShape=shape)
        history = run_threads(spec, shard_rows(x, y[:rows], 2))[0].history  # 4 epochs: whole averaging periods
        out[strategy] = float(np.mean([h["bytesPerStep"] for h in history]))
    return out


def apply_time(rule: str, n: int = 1_000_000, reps: int = 5) -> float:
    """Seconds per parameter for one server-side update (one torch thread)."""
    w, g, pulled = torch.randn(n), torch.randn(n), torch.randn(n)
    acc = torch.zeros(n)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        if rule == "adagrad":
            acc.addcmul_(g, g)
            w.addcdiv_(g, acc.sqrt().add_(1e-10), value=-0.01)
        elif rule == "rmsprop":
            acc.mul_(0.9).addcmul_(g, g, value=0.1)
            w.addcdiv_(g, acc.sqrt().add_(1.0), value=-0.1)
        else:  # dcasgd: g + lambda * g * g * (w - w_pulled), then SGD
            d = g * g * (w - pulled)
            w.add_(g.add(d, alpha=0.04), alpha=-0.01)
            pulled.copy_(w)
        best = min(best, time.perf_counter() - t0)
    return best / n


def ps_bytes(params: int) -> float:
    return 4.0 * params * (1 + 1 / FETCH_EVERY)


def scenario(m: dict, strategy: str, nodes: int, gbit: float, shards: int, dedicated: bool = False) -> Scenario:
    ps = strategy in ("downpour", "dcasgd", "mixed")
    group = GROUP if strategy == "mixed" and nodes % GROUP == 0 else (nodes if strategy == "mixed" else 1)
    return Scenario(nodes=nodes, compute=m["compute"], batch=32, params=m["params"], strategy=strategy,
                    nbytes=ps_bytes(m["params"]) if ps else m["bytes"][strategy], bandwidth_gbit=gbit,
                    shards=shards, dedicated=dedicated, fetch_every=FETCH_EVERY, group=group,
                    apply_per_param=m["apply"]["dcasgd" if strategy == "dcasgd" else "adagrad"])


def grid(m: dict, steps: int) -> dict:
    """Throughput and staleness per (strategy, bandwidth, nodes), shards = min(nodes, 8) on the workers."""
    out = {}
    for gbit in BANDWIDTHS:
        for strategy in [*COLLECTIVES, "downpour", "dcasgd", "mixed"]:
            for n in NODES:
                r = simulate(scenario(m, strategy, n, gbit, min(n, 8)), steps)
                out[strategy, gbit, n] = (r.samples_per_second, percentiles(r.staleness))
    return out


def shard_table(name: str, m: dict, steps: int) -> list[str]:
    lines = [f"{name}: downpour at 8 workers, samples/s by shards (co-located | dedicated, per node used)"]
    lines.append(f"{'Gbit/s':>7} {'shards':>6} {'co-located':>12} {'dedicated':>12} {'per node co':>12} "
                 f"{'per node ded':>12}")
    for gbit in BANDWIDTHS:
        for k in (1, 2, 4, 8):
            co = simulate(scenario(m, "downpour", 8, gbit, k), steps)
            de = simulate(scenario(m, "downpour", 8, gbit, k, dedicated=True), steps)
            lines.append(f"{gbit:>7g} {k:>6} {co.samples_per_second:>12,.0f} {de.samples_per_second:>12,.0f} "
                         f"{co.samples_per_second / co.nodes_used:>12,.0f} "
                         f"{de.samples_per_second / de.nodes_used:>12,.0f}")
    return lines


def grid_table(name: str, m: dict, g: dict) -> list[str]:
    lines = [f"{name}: samples/s (staleness p50/p95) at 8 and 64 nodes, shards = min(nodes, 8) co-located"]
    lines.append(f"{'strategy':<16} {'Gbit/s':>6} {'1 node':>9} {'8 nodes':>10} {'eff 8':>6} {'stale 8':>8} "
                 f"{'64 nodes':>11} {'eff 64':>6} {'stale 64':>9}")
    for (strategy, gbit, n), (sps, st) in g.items():
        if n != 1:
            continue
        s8, st8 = g[strategy, gbit, 8]
        s64, st64 = g[strategy, gbit, 64]
        lines.append(f"{strategy:<16} {gbit:>6g} {sps:>9,.0f} {s8:>10,.0f} {s8 / sps / 8:>6.2f} "
                     f"{st8[0]:>3.0f}/{st8[1]:<4.0f} {s64:>11,.0f} {s64 / sps / 64:>6.2f} "
                     f"{st64[0]:>3.0f}/{st64[1]:<4.0f}")
    return lines


def _paper_run(gbit: float, nodes: int, shards: int, dedicated: bool, steps: int, apply: float) -> Scenario:
    p = PAPER
    return simulate(Scenario(nodes=nodes, compute=p["batch"] / p["one_node"], batch=p["batch"], params=p["params"],
                             strategy="downpour", nbytes=8.0 * p["params"], bandwidth_gbit=gbit, shards=shards,
                             dedicated=dedicated, apply_per_param=apply), steps)


def inferred_server_cost(steps: int) -> float:
    """Seconds per parameter at which one server reproduces Table 1's one-server row (bisection).

    That row is the one configuration bound by a single server; the cost includes what the
    paper's servers did per update beyond the arithmetic (gRPC, serialization, copies).
    """
    label, n, k, dedicated, paper = PAPER["table1"][2]
    lo, hi = 1e-11, 1e-6
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if _paper_run(PAPER["gbit"], n, k, dedicated, steps, mid).samples_per_second < paper \
            else (mid, hi)
    return math.sqrt(lo * hi)


def paper_tables(steps: int, apply: float, title: str, gbit: float = PAPER["gbit"]) -> tuple[list[str], dict]:
    """The ICCS 2017 cluster from its own figures, beside its Tables 2 and 1.

    Speedups are against one node's compute rate (124.18 img/s, the paper's one-node run,
    whose variables stay in local memory).
    """
    p = PAPER
    base = p["one_node"]
    lines = [title, f"{'configuration':<30} {'paper img/s':>11} {'speedup':>8} {'eff':>5} | {'sim img/s':>9} "
                    f"{'speedup':>8} {'eff':>5} {'sim/paper':>9}"]
    rows = [(f"{n} nodes ({n} workers + {max(1, n - 1)} PS)", n, max(1, n - 1), False, paper)
            for n, paper in p["table2"].items()]
    curve = {}
    for i, (label, n, k, dedicated, paper) in enumerate(rows + p["table1"]):
        if i == len(rows):
            lines.append("Table 1 (4 workers):")
        r = _paper_run(gbit, n, k, dedicated, steps, apply)
        speedup, used = r.samples_per_second / base, r.nodes_used
        if i < len(rows):
            curve[n] = speedup
        lines.append(f"{label:<30} {paper:>11.2f} {paper / p['one_node']:>8.2f} {paper / p['one_node'] / used:>5.2f} | "
                     f"{r.samples_per_second:>9.1f} {speedup:>8.2f} {speedup / used:>5.2f} "
                     f"{speedup / (paper / p['one_node']):>9.2f}")
    return lines, curve


def plot(models: dict, grids: dict, paper_curve: dict[str, dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(len(models), len(BANDWIDTHS), figsize=(13, 4.2 * len(models)), squeeze=False)
    for row, name in enumerate(models):
        for col, gbit in enumerate(BANDWIDTHS):
            ax = axes[row][col]
            for strategy in [*COLLECTIVES, "downpour", "dcasgd", "mixed"]:
                ax.plot(NODES, [grids[name][strategy, gbit, n][0] for n in NODES], marker=".", label=strategy)
            one = grids[name]["sync", gbit, 1][0]
            ax.plot(NODES, [one * n for n in NODES], "k:", label="linear")
            ax.set(xscale="log", yscale="log", xlabel="nodes", ylabel="samples/s", title=f"{name}, {gbit:g} Gbit/s")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "simulate_scale_throughput.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for strategy in ("downpour", "mixed"):
        a.plot(NODES, [grids["mlp"][strategy, 10.0, n][1][0] for n in NODES], marker=".", label=f"{strategy} p50")
        a.plot(NODES, [grids["mlp"][strategy, 10.0, n][1][1] for n in NODES], ls="--", label=f"{strategy} p95")
    a.set(xscale="log", xlabel="nodes", ylabel="staleness (versions)", title="mlp, 10 Gbit/s")
    a.legend(fontsize=7)
    ns = sorted(PAPER["table2"])
    for label, curve in paper_curve.items():
        b.plot(ns, [curve[n] for n in ns], marker="o", label=f"simulated, {label}")
    b.plot(ns, [PAPER["table2"][n] / PAPER["one_node"] for n in ns], marker="s", label="ICCS 2017 Table 2")
    b.plot(ns, ns, "k:", label="linear")
    b.set(xlabel="nodes", ylabel="speedup", title="paper scenario (ResNet-50, 56 Gbit/s)")
    b.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "simulate_scale_staleness_paper.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few measured and simulated steps (a smoke run)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder for the PNG files")
    args = parser.parse_args()
    run = Run(__file__, packages=("torch", "numpy"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    steps, sim_steps = (3, 20) if args.quick else (30, 100)
    apply = {rule: apply_time(rule) for rule in ("adagrad", "dcasgd", "rmsprop")}
    models = {}
    for name in MODELS:
        compute, params = step_time(name, steps)
        models[name] = {"compute": compute, "params": params, "apply": apply,
                        "bytes": collective_bytes(name, 96 if args.quick else 256)}
    lines = ["measured here: " + "; ".join(
                 f"{n} {m['params']:,} params, {m['compute'] * 1e3:.2f} ms/step (batch 32), bytes/step "
                 + ", ".join(f"{s} {b:,.0f}" for s, b in m["bytes"].items()) for n, m in models.items()),
             "server update per parameter: " + ", ".join(f"{r} {t * 1e9:.2f} ns" for r, t in apply.items()), ""]
    grids = {}
    for name, m in models.items():
        grids[name] = grid(m, sim_steps)
        lines += grid_table(name, m, grids[name]) + [""] + shard_table(name, m, sim_steps) + [""]
    head = ("paper scenario (ICCS 2017): ResNet-50 25.5 M params, 128 img/node/step, 124.18 img/s on 1 node, "
            "56 Gbit/s, RMSProp on the servers")
    nominal, curve = paper_tables(sim_steps, apply["rmsprop"],
                                  f"{head}; server cost: the RMSProp update measured here")
    cost = inferred_server_cost(sim_steps)
    inferred, curve_cost = paper_tables(sim_steps, cost, f"{head}; server cost {cost * 1e9:.1f} ns/param, "
                                        "inferred from Table 1's one-server row (every other row is a prediction)")
    lines += nominal + [""] + inferred
    pngs = plot(models, grids, {"measured update": curve, "inferred server cost": curve_cost}, out)
    root = Path(__file__).resolve().parents[1]
    lines += ["figures: " + ", ".join(str(p.resolve().relative_to(root)) if p.resolve().is_relative_to(root) else str(p)
                                      for p in pngs)]
    text = "\n".join(run.header("one torch thread") + lines) + "\n"
    print(text)
    if not args.quick and out.resolve() == (root / "benchmarks" / "results").resolve():
        (out / "simulate_scale.txt").write_text(text)


if __name__ == "__main__":
    main()
