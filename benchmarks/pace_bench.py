"""PACE, its ablations, the DVD-style baseline and REVEAL on one generated benchmark (PACE Tables 4/6, Fig. 3/4/5).

Generates a test split with `reveal_kit.synth.bench` (`--split short`: 3 videos of 2 minutes, 36 questions;
`--split long`: 10 videos of 10 minutes, 120 questions, where ClipSearch's 16 records and EvidenceRetrieve's 8 no
longer cover a video), runs every method through the resumable runner (`reveal_kit.eval.methods` registers the PACE
methods) and prints per method: accuracy, needle recall (one matching rule for every method: the lexical judge
`pace.needle.needle_recall` over what a judge sees of the result, `pace.needle.judge_rows`), mean steps, tool calls
per episode by tool, invalid calls, tool errors, degraded answers, model calls and tokens per query, indexing tokens
per clip, seconds per question; then paired comparisons (McNemar) pace vs dvd / reveal / the ablations, the wall time of building the plain and the factor-conditioned indexes per
video, and with `--sweep` the factor-budget sweep k = 1…5. Rerunning resumes; `--report` only prints what is there.

With the offline roles (the default) no model is called: every token count is 0 by construction, and the numbers
measure the mechanism (which evidence each method's tools surface), not a backbone. `--roles model` runs the model
policy instead (the embedded base model gives valid JSON but meaningless content): the table then shows whether the
tool-calling loop executes — tools called, steps, invalid calls, degraded answers, seconds per question.

    .venv/bin/python benchmarks/pace_bench.py [--split short|long] [--sweep] [--limit N] [--report]
    .venv/bin/python benchmarks/pace_bench.py --split long --roles model --backend embedded --limit 2 --methods pace \
        --set pace_max_steps=6
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
from reveal_kit.synth.bench import generate_benchmark, load_questions
from reveal_kit.eval.runner import run_eval
from reveal_kit.eval.metrics import load_results, compare
import reveal_kit.eval.methods  # noqa: F401  (registers the PACE methods with the runner)
from reveal_kit.pace.needle import needle_recall, judge_rows

METHODS = ['pace', 'dvd', 'pace-no-qcindex', 'pace-no-verify', 'reveal']
TOOLS = ['GlobalBrowse', 'ClipSearch', 'FrameInspect', 'QueryDecompose', 'EvidenceRetrieve', 'Finish']
SPLITS = {'short': dict(videos=3, minutes=2.0, questions_per_video=12, out='pace'),
          'long': dict(videos=10, minutes=10.0, questions_per_video=12, out='pace_long')}


def mean(xs) -> float:
    xs = [float(x) for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float('nan')


def summarize(rs: list[dict], qs: dict) -> dict:
    "Accuracy, needle recall, steps, tool calls per episode, failures, calls and tokens per query, tokens per clip."
    n = max(len(rs), 1)
    nr = [needle_recall(qs[r['qid']], judge_rows(r)) for r in rs]
    tools = Counter(t for r in rs for t, k in (r.get('tool_calls') or {}).items() for _ in range(k))
    idx = [r['index'] for r in rs if r.get('index')]
    tok_clip = mean([i['prompt_tokens_per_clip'] + i['completion_tokens_per_clip'] for i in idx]) if idx else 0.0
    return dict(n=len(rs), acc=mean([r.get('correct') for r in rs]), needle=mean(nr),
                steps=mean([r.get('rounds') for r in rs]), tools={t: tools[t] / n for t in TOOLS},
                other=sum(v for t, v in tools.items() if t not in TOOLS) / n,
                invalid=mean([r.get('invalid_calls', 0) for r in rs]), terr=mean([r.get('tool_errors', 0) for r in rs]),
                degraded=sum(bool(r.get('degraded')) for r in rs), calls=mean([r.get('llm_calls') for r in rs]),
                tok_q=mean([(r.get('prompt_tokens') or 0) + (r.get('completion_tokens') or 0) for r in rs]),
                tok_clip=tok_clip,
                sec=mean([r.get('seconds') for r in rs]), failed=sum(bool(r.get('failed')) for r in rs))


def table(rows: dict[str, dict]) -> str:
    "One line per method (tool columns: calls per episode; `other`: calls naming no tool, i.e. invalid replies)."
    head = (f"{'method':<17}{'n':>4}{'acc %':>7}{'needle %':>9}{'steps':>6}" + ''.join(f"{t[:6]:>7}" for t in TOOLS)
            + f"{'other':>6}{'inval':>6}{'t.err':>6}{'degr':>5}{'calls/q':>8}{'tok/q':>7}{'tok/clip':>9}{'s/q':>6}"
            + f"{'fail':>5}")
    L = [head]
    for m, s in rows.items():
        L.append(f"{m:<17}{s['n']:>4}{100 * s['acc']:>7.1f}{100 * s['needle']:>9.1f}{s['steps']:>6.2f}"
                 + ''.join(f"{s['tools'][t]:>7.2f}" for t in TOOLS)
                 + f"{s['other']:>6.2f}{s['invalid']:>6.2f}{s['terr']:>6.2f}{s['degraded']:>5}{s['calls']:>8.2f}"
                 + f"{s['tok_q']:>7.0f}{s['tok_clip']:>9.0f}{s['sec']:>6.1f}{s['failed']:>5}")
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


def paired(res: dict[str, list[dict]]) -> list[str]:
    "pace against each other method on the questions both answered: difference, discordant pairs, McNemar p, CI."
    L = []
    for y in [m for m in res if m != 'pace']:
        if 'pace' not in res or not res[y] or not res['pace']: continue
        c = compare(res['pace'], res[y], names=('pace', y))
        if not c['n_common']: continue
        L.append(f"paired pace vs {y}: n={c['n_common']} diff {100 * (c['accuracy_diff'] or 0):+.1f} pts, "
                 f"only pace right {c['only_a_correct']}, only {y} right {c['only_b_correct']}, "
                 f"McNemar p={c['mcnemar_p']:.3f}, 95% CI [{100 * c['bootstrap_ci95'][0]:+.1f}, "
                 f"{100 * c['bootstrap_ci95'][1]:+.1f}]")
    return L


def run_name(m: str, roles: str, backend: str, overrides: list[str]) -> str:
    "The run folder of a method: `run_<m>` (offline roles), else `run_<m>__<backend>-<roles>`; `+k=v` per override."
    return (f"run_{m}" if roles == 'offline' else f"run_{m}__{backend}-{roles}") + ''.join(f"+{o}" for o in overrides)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--split', choices=sorted(SPLITS), default='short')
    ap.add_argument('--out', type=Path, default=None, help='default runs/bench/pace (short) or pace_long (long)')
    ap.add_argument('--videos', type=int, default=None)
    ap.add_argument('--minutes', type=float, default=None)
    ap.add_argument('--questions-per-video', type=int, default=None)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--backend', default='embedded')
    ap.add_argument('--roles', choices=['offline', 'auto', 'model'], default='offline')
    ap.add_argument('--methods', default=','.join(METHODS))
    ap.add_argument('--sweep', action='store_true', help='also run pace-factors-1 … pace-factors-5')
    ap.add_argument('--limit', type=int, default=None, help='only the first N questions (in benchmark order)')
    ap.add_argument('--report', action='store_true', help='run nothing: print what the run folders hold')
    ap.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                    help='Config override, e.g. pace_max_steps=6 (use a fresh --out or run folder)')
    a = ap.parse_args()
    sp = SPLITS[a.split]
    videos, minutes = a.videos or sp['videos'], a.minutes or sp['minutes']
    qpv, out = a.questions_per_video or sp['questions_per_video'], a.out or runs_dir() / 'bench' / sp['out']
    os.environ.setdefault('REVEAL_RUNS', str(out / 'runs'))
    data = out / 'data'
    if not (data / 'questions.jsonl').exists():
        t = time.time()
        generate_benchmark(data, minutes=minutes, videos=videos, questions_per_video=qpv, seed=a.seed, split='test',
                           progress=False)
        print(f"generated {videos} videos of {minutes:g} min in {time.time() - t:.0f} s")
    qs = {q.qid: q for q in load_questions(data)}
    methods = a.methods.split(',') + ([f'pace-factors-{k}' for k in range(1, 6)] if a.sweep else [])
    res = {}
    for m in methods:
        d = out / run_name(m, a.roles, a.backend, a.set)
        if not a.report:
            run_eval('synth', m, d, root=data, backend=a.backend, limit=a.limit, roles=a.roles, overrides=a.set,
                     progress=False)
        res[m] = load_results(d) if (d / 'results.jsonl').exists() else []
        if a.limit: res[m] = [r for r in res[m] if r['qid'] in set(list(qs)[:a.limit])]
    print(f"{len(qs)} questions over {videos} generated videos of {minutes:g} min; backend {a.backend}, roles "
          f"{a.roles}" + (f"; first {a.limit} questions" if a.limit else ''))
    print(table({m: summarize(rs, qs) for m, rs in res.items() if rs}))
    print('\n'.join(paired(res)))
    if a.roles != 'offline':
        for m, rs in res.items():
            stops = Counter(r.get('stop_reason') for r in rs)
            fails = Counter(k for r in rs for k, v in (r.get('failed_calls') or {}).items() for _ in range(v))
            print(f"{m}: stop reasons {dict(stops)}; failed model calls by role {dict(fails) or 'none'}; "
                  f"factor source {dict(Counter(r.get('factor_source') for r in rs))}")
    types = sorted({q.qtype for q in qs.values()})
    print('per-type accuracy %:')
    print(f"{'method':<17}" + ''.join(f"{t[:9]:>10}" for t in types))
    for m, rs in res.items():
        print(f"{m:<17}" + ''.join(f"{100 * mean([r.get('correct') for r in rs if r.get('qtype') == t]):>10.1f}"
                                   for t in types))
    print('question factors |F_Q| per method (count of questions):')
    for m, rs in res.items():
        if any(r.get('factors') is not None for r in rs):
            print(f"  {m:<17}{dict(sorted(Counter(len(r.get('factors') or []) for r in rs).items()))}")
    print('index build times (wall seconds on this machine, as recorded in the manifests):')
    print('\n'.join(index_walls(Path(os.environ['REVEAL_RUNS']) / 'pace')) or '  (none)')


if __name__ == '__main__':
    main()
