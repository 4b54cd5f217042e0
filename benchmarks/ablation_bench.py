"""REVEAL component ablation on a generated dev benchmark (SPEC §5 Table 2).

Generates a dev split with `reveal_kit.synth.bench`, runs every preset of `reveal_kit.reveal.presets.PRESETS` through the
resumable runner (memories built once per video and chunking, then reused), and prints accuracy, mean rounds, model calls per
question and stop reasons per preset, plus per-type accuracy. Rerunning resumes.

    .venv/bin/python benchmarks/ablation_bench.py [--out runs/bench/ablation] [--videos 5] [--minutes 5] \
        [--backend embedded]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')

from reveal_kit.core import runs_dir
from reveal_kit.reveal.presets import PRESETS
from reveal_kit.synth.bench import generate_benchmark
from reveal_kit.eval.runner import run_eval
from reveal_kit.eval.metrics import load_results, report


def row(name: str, r: dict, wall: float) -> str:
    "One table line for a preset."
    stops = ', '.join(f"{k} {v}" for k, v in r['stop_reasons'].items())
    return (f"{name:<12}{r['n']:>5}{100 * (r['accuracy'] or 0):>7.1f}{r['rounds_mean'] or 0:>7.2f}"
            f"{r['llm_calls_mean'] or 0:>8.2f}{wall:>8.1f}  {stops}")


def relevance_calibration(out: Path, data: Path, backend: str) -> None:
    "Run the three rows without a verifier for a fixed 3 rounds on the dev split and choose the relevance threshold."
    from reveal_kit.eval.methods import register_method
    from reveal_kit.reveal.agent import answer_question
    from reveal_kit.reveal.ask import load_trace
    from reveal_kit.reveal.presets import get_preset
    from reveal_kit.reveal.relevance import RELEVANCE_COSINE, choose_threshold, partner_question, relevance_rows
    from reveal_kit.retrieval.choice import get_text_embedder
    from reveal_kit.synth.bench import load_questions
    qs, emb, rows = {q.qid: q for q in load_questions(data)}, get_text_embedder(), []
    for p in ('+iter', '+offmem', '+onmem'):
        spec = get_preset(p, name=f'{p}-k3', fixed_rounds=3)
        register_method(spec.name)(lambda q, ctx, spec=spec: answer_question(
            q, ctx.memory(q, spec.chunking), ctx.model, ctx.config, spec, trace_dir=ctx.trace_dir, roles=ctx.roles,
            pool=ctx.rubric_pool()))
        d = out / f"relevance_{p.replace('+', 'plus_')}"
        run_eval('synth', spec.name, d, root=data, backend=backend, progress=False)
        for r in load_results(d):
            q, tr = qs[r['qid']], load_trace(r['trace'])
            other = partner_question(q, list(qs.values()))
            own = relevance_rows(q, tr, emb.encode)
            rows += [dict(x, method=p) for x in own + (relevance_rows(q, tr, emb.encode, other) if other else [])]
    grid = [round(0.30 + 0.025 * i, 3) for i in range(21)]
    best, table = choose_threshold(rows, grid)
    own = [r for r in rows if r['judged'] == r['qid']]
    print(f"{len(rows)} (question, method, round, judged question) rows on {len(qs)} dev questions: {len(own)} "
          f"judged for their own question ({sum(r['relevant'] for r in own)} relevant by the annotated spans), "
          f"{len(rows) - len(own)} for a same-type question about another video (never relevant); "
          f"embedder {emb.model_id}")
    print(f"{'threshold':>10}{'tpr':>8}{'tnr':>8}{'bal.acc':>9}{'judged rel.':>12}")
    for t in table:
        mark = '  <- chosen' if t['threshold'] == best else ''
        print(f"{t['threshold']:>10.3f}{t['tpr']:>8.3f}{t['tnr']:>8.3f}{t['balanced_accuracy']:>9.3f}"
              f"{t['judged_relevant']:>12.3f}{mark}")
    print(f"chosen threshold {best} (RELEVANCE_COSINE in the kit: {RELEVANCE_COSINE})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', type=Path, default=runs_dir() / 'bench' / 'ablation')
    ap.add_argument('--videos', type=int, default=5)
    ap.add_argument('--minutes', type=float, default=5.0)
    ap.add_argument('--questions-per-video', type=int, default=12)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--backend', default='embedded')
    ap.add_argument('--presets', default=','.join(PRESETS))
    ap.add_argument('--relevance', action='store_true', help='choose the relevance-stop threshold on the dev split')
    a = ap.parse_args()
    data = a.out / 'data'
    if not (data / 'questions.jsonl').exists():
        generate_benchmark(data, minutes=a.minutes, videos=a.videos, questions_per_video=a.questions_per_video,
                           seed=a.seed, split='dev')
    if a.relevance:
        return relevance_calibration(a.out, data, a.backend)
    lines, types = [f"{'preset':<12}{'n':>5}{'acc %':>7}{'rounds':>7}{'calls/q':>8}{'wall s':>8}  stop reasons"], {}
    for p in a.presets.split(','):
        t = time.time()
        run_eval('synth', p, a.out / f"run_{p.replace('+', 'plus_')}", root=data, backend=a.backend, progress=False)
        r = report(load_results(a.out / f"run_{p.replace('+', 'plus_')}"))
        lines.append(row(p, r, time.time() - t))
        types[p] = r['by_qtype']
    print('\n'.join(lines))
    qt = sorted({k for v in types.values() for k in v})
    print('\nper-type accuracy %\n' + f"{'preset':<12}" + ''.join(f"{t[:10]:>11}" for t in qt))
    for p, v in types.items():
        print(f"{p:<12}" + ''.join(f"{100 * (v[t]['accuracy'] or 0) if t in v else float('nan'):>11.1f}" for t in qt))


if __name__ == '__main__':
    main()
