"""Evaluation harness benchmark: every baseline and method on one generated benchmark.

Generates a test benchmark with `reveal_kit.synth.bench` (default: 20 two-minute videos, ~106 questions), runs `blind`,
`direct`, `base` and `reveal` on it through the resumable runner (`reveal_kit.eval.runner.run_eval`) with the chosen backend
(default: the embedded model, i.e. the deterministic offline roles), then prints the table of accuracy / rounds /
calls / wall time per method and the paired comparison `reveal` vs `base` (McNemar exact test, paired bootstrap CI).
Rerunning resumes: finished questions are skipped, memories are reused from `$REVEAL_RUNS/memories`.

    .venv/bin/python benchmarks/eval_bench.py [--out runs/bench/eval] [--videos 20] [--minutes 2] [--backend embedded]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')

from reveal_kit.core import runs_dir
from reveal_kit.io import atomic_write_json
from reveal_kit.synth.bench import generate_benchmark
from reveal_kit.eval.runner import run_eval
from reveal_kit.eval.metrics import load_results, report, compare, format_compare

METHODS = ('blind', 'direct', 'base', 'reveal')


def table(out: Path, walls: dict) -> str:
    "One line per method: accuracy, failures, rounds, calls, tokens, wall time."
    L = [f"{'method':<8}{'n':>5}{'acc %':>7}{'failed':>7}{'unparse':>8}{'rounds':>7}{'calls/q':>8}{'tok/q':>7}{'s/q':>7}"
         f"{'elapsed s':>10}"]
    for m in METHODS:
        p = out / f'run_{m}'
        if not (p / 'results.jsonl').exists(): continue
        r = report(load_results(p))
        tok = (r['prompt_tokens_mean'] or 0) + (r['completion_tokens_mean'] or 0)
        L.append(f"{m:<8}{r['n']:>5}{100 * r['accuracy']:>7.1f}{r['failed']:>7}{r['unparseable']:>8}"
                 f"{r['rounds_mean'] or 0:>7.2f}{r['llm_calls_mean'] or 0:>8.2f}{tok:>7.0f}{r['seconds_mean'] or 0:>7.2f}"
                 f"{walls.get(m, float('nan')):>10.1f}")
    return '\n'.join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', type=Path, default=runs_dir() / 'bench' / 'eval')
    ap.add_argument('--videos', type=int, default=20)
    ap.add_argument('--minutes', type=float, default=2.0)
    ap.add_argument('--questions-per-video', type=int, default=11)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--backend', default='embedded')
    ap.add_argument('--concurrency', type=int, default=2)
    a = ap.parse_args()
    data = a.out / 'data'
    if not (data / 'questions.jsonl').exists():
        t = time.time()
        man = generate_benchmark(data, minutes=a.minutes, videos=a.videos, questions_per_video=a.questions_per_video,
                                 seed=a.seed, progress=True)
        print(f"generated {man['n_questions']} questions on {man['n_videos']} videos in {time.time() - t:.0f} s")
    walls = {}
    for m in METHODS:
        t = time.time()
        s = run_eval('synth', m, a.out / f'run_{m}', root=data, backend=a.backend, concurrency=a.concurrency)
        walls[m] = time.time() - t
        print(m, json.dumps(s))
    print(table(a.out, walls))
    c = compare(load_results(a.out / 'run_reveal'), load_results(a.out / 'run_base'), names=('reveal', 'base'))
    print(format_compare(c))
    atomic_write_json(a.out / 'eval_bench.json', dict(walls=walls, compare=c))


if __name__ == '__main__':
    main()
