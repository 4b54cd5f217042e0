"""PACE, its ablations, the DVD-style baseline and REVEAL on one generated benchmark (PACE Tables 4/6, Fig. 3/4/5).

Generates a small test split with `reveal_kit.synth_bench` (default 3 videos of 2 minutes), runs every method through
the resumable runner (`reveal_kit.pace_agent` registers the PACE methods), and prints per method: accuracy, needle
recall (the same matching rule for every method: `pace_agent.needle_recall` over the result's evidence), mean steps,
tool calls per episode by tool, model calls and tokens per query, indexing tokens per clip; then paired comparisons
pace vs dvd and pace vs reveal, the wall time of building the plain and a factor-conditioned index per video, and with
`--sweep` the factor-budget sweep k = 1…5. With the offline roles (the default embedded model is not meaningful) no
model is called: every token count is 0 by construction. Rerunning resumes.

    .venv/bin/python benchmarks/pace_bench.py [--out runs/bench/pace] [--videos 3] [--minutes 2] [--sweep]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')

from reveal_kit.core import runs_dir
from reveal_kit.synth_bench import generate_benchmark, load_questions
from reveal_kit.runner import run_eval
from reveal_kit.metrics import load_results, compare
import reveal_kit.pace_agent  # noqa: F401  (registers the PACE methods with the runner)
from reveal_kit.pace_agent import needle_recall

METHODS = ['pace', 'pace-no-qcindex', 'pace-no-verify', 'dvd', 'reveal']
TOOLS = ['GlobalBrowse', 'ClipSearch', 'FrameInspect', 'QueryDecompose', 'EvidenceRetrieve', 'Finish']


def mean(xs) -> float:
    xs = [float(x) for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float('nan')


def summarize(rs: list[dict], qs: dict) -> dict:
    "Accuracy, needle recall, steps, tool calls per episode, calls and tokens per query, index tokens per clip."
    nr = [needle_recall(qs[r['qid']], r.get('evidence') or []) for r in rs]
    tools = Counter(t for r in rs for t, n in (r.get('tool_calls') or {}).items() for _ in range(n))
    idx = [r['index'] for r in rs if r.get('index')]
    return dict(n=len(rs), acc=mean([r.get('correct') for r in rs]), needle=mean(nr),
                steps=mean([r.get('rounds') for r in rs]), tools={t: tools[t] / len(rs) for t in TOOLS},
                calls=mean([r.get('llm_calls') for r in rs]),
                tok_q=mean([(r.get('prompt_tokens') or 0) + (r.get('completion_tokens') or 0) for r in rs]),
                tok_clip=mean([i['prompt_tokens_per_clip'] + i['completion_tokens_per_clip'] for i in idx]) if idx else 0.0,
                failed=sum(bool(r.get('failed')) for r in rs))


def table(rows: dict[str, dict], walls: dict[str, float]) -> str:
    head = (f"{'method':<17}{'n':>4}{'acc %':>7}{'needle %':>9}{'steps':>6}" + ''.join(f"{t[:6]:>7}" for t in TOOLS)
            + f"{'calls/q':>8}{'tok/q':>6}{'tok/clip':>9}{'fail':>5}{'wall s':>8}")
    L = [head]
    for m, s in rows.items():
        L.append(f"{m:<17}{s['n']:>4}{100 * s['acc']:>7.1f}{100 * s['needle']:>9.1f}{s['steps']:>6.2f}"
                 + ''.join(f"{s['tools'][t]:>7.2f}" for t in TOOLS)
                 + f"{s['calls']:>8.2f}{s['tok_q']:>6.0f}{s['tok_clip']:>9.0f}{s['failed']:>5}{walls.get(m, 0):>8.1f}")
    return '\n'.join(L)


def index_walls(pace_root: Path) -> list[str]:
    "Build seconds of each plain and factor-conditioned index under runs/pace (as recorded in their manifests)."
    L = []
    for d in sorted(pace_root.glob('*/')):
        plain = d / 'plain' / 'manifest.json'
        if not plain.exists(): continue
        m = json.loads(plain.read_text())
        fs = [json.loads(p.read_text())['build_seconds'] for p in d.glob('factors-*/manifest.json')]
        L.append(f"  {d.name}: {m['n_clips']} clips of {m['config']['pace_clip_s']:g} s, video {m['duration']:.0f} s; "
                 f"plain index {m['build_seconds']:.1f} s; {len(fs)} factor indexes, mean {mean(fs):.2f} s each")
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', type=Path, default=runs_dir() / 'bench' / 'pace')
    ap.add_argument('--videos', type=int, default=3)
    ap.add_argument('--minutes', type=float, default=2.0)
    ap.add_argument('--questions-per-video', type=int, default=12)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--backend', default='embedded')
    ap.add_argument('--methods', default=','.join(METHODS))
    ap.add_argument('--sweep', action='store_true', help='also run pace-factors-1 … pace-factors-5')
    a = ap.parse_args()
    os.environ.setdefault('REVEAL_RUNS', str(a.out / 'runs'))
    data = a.out / 'data'
    if not (data / 'questions.jsonl').exists():
        generate_benchmark(data, minutes=a.minutes, videos=a.videos, questions_per_video=a.questions_per_video,
                           seed=a.seed, split='test', progress=False)
    qs = {q.qid: q for q in load_questions(data)}
    methods = a.methods.split(',') + ([f'pace-factors-{k}' for k in range(1, 6)] if a.sweep else [])
    rows, walls, res = {}, {}, {}
    for m in methods:
        t = time.time()
        run_eval('synth', m, a.out / f"run_{m}", root=data, backend=a.backend, progress=False)
        walls[m] = time.time() - t
        res[m] = load_results(a.out / f"run_{m}")
        rows[m] = summarize(res[m], qs)
    print(f"{len(qs)} questions over {a.videos} generated videos of {a.minutes:g} min (backend {a.backend}; "
          f"offline roles unless the model is meaningful)")
    print(table(rows, walls))
    for x, y in (('pace', 'dvd'), ('pace', 'reveal'), ('pace', 'pace-no-qcindex'), ('pace', 'pace-no-verify')):
        if x in res and y in res:
            c = compare(res[x], res[y], names=(x, y))
            print(f"paired {x} vs {y}: n={c['n_common']} diff {100 * (c['accuracy_diff'] or 0):+.1f} pts, "
                  f"only {x} right {c['only_a_correct']}, only {y} right {c['only_b_correct']}, "
                  f"McNemar p={c['mcnemar_p']:.3f}, 95% CI [{100 * c['bootstrap_ci95'][0]:+.1f}, "
                  f"{100 * c['bootstrap_ci95'][1]:+.1f}]")
    print('per-type accuracy %:')
    types = sorted({q.qtype for q in qs.values()})
    print(f"{'method':<17}" + ''.join(f"{t[:9]:>10}" for t in types))
    for m, rs in res.items():
        print(f"{m:<17}" + ''.join(f"{100 * mean([r.get('correct') for r in rs if r.get('qtype') == t]):>10.1f}"
                                   for t in types))
    print('index build times:')
    print('\n'.join(index_walls(Path(os.environ['REVEAL_RUNS']) / 'pace')) or '  (none)')


if __name__ == '__main__':
    main()
