"""Run browser benchmark: how long `reveal trace show RUN --html` takes for runs of 500 to 5,000 questions.

Answers a small generated benchmark with a real method (default `dvd`, whose pages carry tool calls and evidence), then
grows the run to each size by copying its result rows, traces and questions under new question ids (a replay-style
`questions.jsonl` beside the results, so every page has its gold lanes), and times `write_run_browser` on it: the run
page, then one page per question. The time must grow linearly with the number of questions; the script prints the
seconds per size, the milliseconds per question and the ratio of the largest to the smallest per-question cost.

    .venv/bin/python benchmarks/browser_bench.py [--sizes 500,5000] [--method dvd] [--out runs/bench/browser]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')

from reveal_kit.core import runs_dir
from reveal_kit.io import read_jsonl_rows
from reveal_kit.synth.bench import generate_benchmark
from reveal_kit.eval.runner import run_eval
from reveal_kit.eval.browser import write_run_browser


def seed_run(out: Path, method: str) -> Path:
    "A real run of `method` on one short generated video (reused when present)."
    bench, run = out / 'bench', out / f'seed-{method}'
    if not (bench / 'questions.jsonl').exists():
        generate_benchmark(bench, minutes=1.0, videos=1, questions_per_video=4, size=(320, 180), progress=False)
    run_eval('synth', method, run, root=bench, progress=False)
    return run


def grown_run(seed: Path, bench: Path, n: int, dest: Path) -> Path:
    "A run of `n` questions made of the seed run's rows, traces and questions under new ids."
    rows = list(read_jsonl_rows(seed / 'results.jsonl'))
    qs = {q['qid']: q for q in read_jsonl_rows(bench / 'questions.jsonl')}
    shutil.rmtree(dest, ignore_errors=True)
    (dest / 'traces').mkdir(parents=True)
    shutil.copy(seed / 'run.json', dest / 'run.json')
    with open(dest / 'results.jsonl', 'w') as res, open(dest / 'questions.jsonl', 'w') as qf:
        for i in range(n):
            r = rows[i % len(rows)]
            qid = f"{r['qid']}-{i:05d}"
            t = dict(json.loads(Path(r['trace']).read_text()), qid=qid)
            p = dest / 'traces' / f"{qid}.json"
            p.write_text(json.dumps(t))
            res.write(json.dumps(dict(r, qid=qid, trace=str(p))) + '\n')
            qf.write(json.dumps(dict(qs[r['qid']], qid=qid)) + '\n')
    return dest


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', type=Path, default=runs_dir() / 'bench' / 'browser')
    ap.add_argument('--sizes', default='500,5000', help="comma-separated run sizes (questions)")
    ap.add_argument('--method', default='dvd')
    a = ap.parse_args()
    seed = seed_run(a.out, a.method)
    per = {}
    print(f"{'questions':>10}{'seconds':>10}{'ms/question':>13}")
    for n in map(int, a.sizes.split(',')):
        run = grown_run(seed, a.out / 'bench', n, a.out / f'run-{n}')
        t = time.perf_counter()
        s = write_run_browser(run, a.out / f'site-{n}' / 'run.html')
        dt = time.perf_counter() - t
        assert s['questions'] == s['traces'] == n, s
        per[n] = 1000 * dt / n
        print(f"{n:>10}{dt:>10.1f}{per[n]:>13.2f}")
    lo, hi = min(per), max(per)
    print(f"per-question cost at {hi} vs {lo} questions: ×{per[hi] / per[lo]:.2f} (linear ≈ 1)")


if __name__ == '__main__':
    main()
