"""Benchmark reveal_kit.retrieval.index.VectorIndex's HNSW path: build time, median query latency, recall@10 vs exact search.

    python benchmarks/index_bench.py                                  # 10k, 100k, 1M; clustered and random
    python benchmarks/index_bench.py --sizes 10000 100000 --kinds clustered
    python benchmarks/index_bench.py --sizes 100000 --expansion-search 64 128 256 --connectivity 16 --json out.json

Vectors are 384-d (all-MiniLM-L6-v2's size). 'clustered' imitates real sentence embeddings: n/100 Gaussian clusters
(cluster spread drawn per cluster), queries drawn fresh from the same clusters; 'random' is isotropic Gaussian, the
worst case for a graph index. Ground truth is exact float32 cosine search (NumPy). Latency is one query at a time.
Build CPU time (all threads) is reported next to wall time because shared machines inflate wall time.
"""
from __future__ import annotations
import argparse, json, os, platform, sys, time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reveal_kit.retrieval.index import (VectorIndex, exact_topk, HNSW_CONNECTIVITY, HNSW_EXPANSION_ADD,  # noqa: E402
                                        HNSW_EXPANSION_SEARCH)


def make_vectors(kind: str, n: int, n_queries: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    "Data (n, dim) and queries (n_queries, dim), float32 unit rows, generated in blocks to bound memory."
    rng = np.random.default_rng(seed)
    total = n + n_queries
    out = np.empty((total, dim), np.float32)
    if kind == 'clustered':
        n_clusters = max(10, n // 100)
        centres = rng.standard_normal((n_clusters, dim), dtype=np.float32)
        spread = rng.uniform(0.5, 1.0, n_clusters).astype(np.float32)
    for i in range(0, total, 100_000):
        m = min(100_000, total - i)
        block = rng.standard_normal((m, dim), dtype=np.float32)
        if kind == 'clustered':
            lab = rng.integers(0, n_clusters, m)
            block = centres[lab] + spread[lab, None] * block
        out[i:i + m] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out[:n], out[n:]


def bench(kind: str, n: int, dim: int, n_queries: int, k: int, connectivity: int, expansion_add: int,
          expansion_search: list[int], n_latency: int = 200) -> list[dict]:
    "One build at (connectivity, expansion_add); recall and latency for each expansion_search."
    X, Q = make_vectors(kind, n, n_queries, dim)
    t0 = time.perf_counter()
    truth, _ = exact_topk(Q, X, k)
    t_exact = time.perf_counter() - t0
    ix = VectorIndex(dim, exact_threshold=0, connectivity=connectivity, expansion_add=expansion_add,
                     expansion_search=expansion_search[0])
    keys = [str(i) for i in range(n)]
    ix.add(keys, X)
    del X
    t0, c0 = time.perf_counter(), time.process_time()
    h = ix._ensure_hnsw()
    build_s, build_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    rows = []
    for es in expansion_search:
        h.expansion_search = es
        res = ix.search(Q, k)
        recall = float(np.mean([len({int(key) for key, _ in r} & set(t.tolist())) / k for r, t in zip(res, truth)]))
        lat = []
        for q in Q[:n_latency]:
            t1 = time.perf_counter()
            ix.search(q, k)
            lat.append(time.perf_counter() - t1)
        rows.append(dict(kind=kind, n=n, dim=dim, connectivity=connectivity, expansion_add=expansion_add,
                         expansion_search=es, build_s=round(build_s, 2), build_cpu_s=round(build_cpu_s, 1),
                         median_query_ms=round(1000 * float(np.median(lat)), 3), recall_at_10=round(recall, 4),
                         exact_numpy_ms_per_query=round(1000 * t_exact / len(Q), 3)))
        print(format_row(rows[-1]), flush=True)
    return rows


HEADER = ("| vectors | n | M | ef_add | ef_search | build wall (s) | build CPU (s) | median query (ms) | recall@10 "
          "| exact NumPy (ms/query, batched) |")


def format_row(r: dict) -> str:
    "One Markdown table row of a result."
    return (f"| {r['kind']} | {r['n']:,} | {r['connectivity']} | {r['expansion_add']} | {r['expansion_search']} | "
            f"{r['build_s']:.1f} | {r.get('build_cpu_s', float('nan')):.1f} | {r['median_query_ms']:.3f} | "
            f"{r['recall_at_10']:.3f} | {r['exact_numpy_ms_per_query']:.2f} |")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--sizes', type=int, nargs='+', default=[10_000, 100_000, 1_000_000])
    ap.add_argument('--kinds', nargs='+', default=['clustered', 'random'], choices=['clustered', 'random'])
    ap.add_argument('--dim', type=int, default=384)
    ap.add_argument('--queries', type=int, default=1000)
    ap.add_argument('--k', type=int, default=10)
    ap.add_argument('--connectivity', type=int, default=HNSW_CONNECTIVITY)
    ap.add_argument('--expansion-add', type=int, default=HNSW_EXPANSION_ADD)
    ap.add_argument('--expansion-search', type=int, nargs='+', default=[HNSW_EXPANSION_SEARCH])
    ap.add_argument('--json', type=Path, help='also write the rows as JSON here')
    a = ap.parse_args(argv)
    print(f"# index_bench: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, dim {a.dim}, "
          f"{a.queries} queries, k {a.k}", flush=True)
    print(HEADER)
    print("|" + "---|" * 10, flush=True)
    rows = []
    for n in a.sizes:
        for kind in a.kinds:
            rows += bench(kind, n, a.dim, a.queries, a.k, a.connectivity, a.expansion_add, a.expansion_search)
            if a.json: a.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == '__main__':
    main()
