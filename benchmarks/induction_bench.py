"""Rubric induction benchmark: induce a pool on a generated dev split, evaluate `reveal` on a disjoint test split.

Induces the experiments' default pool the way `eval.figures.common.SYNTH_POOL` says — a generated dev split (13
two-minute videos, seed 1, ~68 questions), the oracle teacher and the offline proposer, App. B.4's loop
(`reveal_kit.reveal.induction.induce`) — into its own folder, says whether it equals the committed
`rubrics/induced-synth.yaml`, then generates (or reuses) a test benchmark (22 two-minute videos, ~106 questions) and
runs `reveal` on it through the resumable runner twice — with the hand-written seed pool and with the induced pool
(`--set rubric_pool=PATH`) — and prints the filter counts, the per-iteration validation curve, both accuracies and
the paired comparison (McNemar exact test, paired bootstrap). It also scores the model teacher's E⁺ against the oracle
on dev questions with the chat backend (default: the embedded model), in a child process so that a crashing backend
is reported. Rerunning resumes every stage (pairs, iterations, runs, memories).

    .venv/bin/python benchmarks/induction_bench.py [--out runs/bench/induction] [--teacher-questions 20]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')

from reveal_kit.core import runs_dir, project_root
from reveal_kit.io import atomic_write_json
from reveal_kit.synth.bench import generate_benchmark
from reveal_kit.eval.runner import run_eval
from reveal_kit.eval.metrics import compare_runs, format_compare
from reveal_kit.reveal.rubrics import RubricPool, default_pool_path
from reveal_kit.reveal.induction import show_pool, pool_eval_warning
from reveal_kit.eval.figures.common import SYNTH_POOL, ensure_pool

TEACHER_CHILD = r"""
import json, sys
from reveal_kit.core import Config
from reveal_kit.synth.bench import load_questions
from reveal_kit.memory.build import get_or_build_memory
from reveal_kit.backends.models import get_chat_model
from reveal_kit.reveal.pairs import ModelTeacher, OracleTeacher, candidates, teacher_agreement
root, n, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]
qs = load_questions(root)[:n]
model = get_chat_model(backend)
model.chat([{'role': 'user', 'content': 'Reply {"ok": true}'}], schema={'type': 'object'}, max_tokens=8)   # probe first
pred, gold, unusable = {}, {}, 0
for q in qs:
    cands = candidates(q, get_or_build_memory(q.video_path, Config(), subtitles=q.subtitle_path))
    gold[q.qid] = OracleTeacher().label(q, cands).pos
    lab = ModelTeacher(model).label(q, cands)
    unusable += lab.source != 'model'
    pred[q.qid] = lab.pos
print(json.dumps({**teacher_agreement(pred, gold), 'unusable_replies': unusable, 'model': model.model_id}))
"""


def data(out: Path, split: str, videos: int) -> Path:
    "The benchmark folder of a split (generated once)."
    root = out / f'data_{split}'
    if not (root / 'questions.jsonl').exists() or json.loads((root / 'manifest.json').read_text())['n_videos'] < videos:
        man = generate_benchmark(root, minutes=2.0, videos=videos, questions_per_video=11, seed=1, split=split,
                                 progress=True)
        print(f"{split}: {man['n_questions']} questions on {man['n_videos']} videos")
    return root


def teacher_agreement_child(root: Path, n: int, backend: str) -> dict:
    "The model teacher's E⁺ precision / recall against the oracle, or why it was not measured."
    p = subprocess.run([sys.executable, '-c', TEACHER_CHILD, str(root), str(n), backend], capture_output=True,
                       text=True, timeout=3600)
    if p.returncode != 0:
        tail = (p.stderr or '').strip().splitlines()[-1:] or ['']
        return {'measured': False, 'why': f"model teacher process exited with {p.returncode} "
                f"({'segmentation fault' if p.returncode == -11 else tail[0][:200]})"}
    return {'measured': True, **json.loads(p.stdout.strip().splitlines()[-1])}


def curve(rep: dict) -> str:
    "The per-iteration validation curve."
    L = [f"{'iter':>4}{'val acc':>9}{'train acc':>10}{'working':>8}{'criteria':>9}{'+':>4}{'~':>4}{'-':>4}{'w':>4}"
         "  stop"]
    for r in rep['iterations']:
        L.append(f"{r['iteration']:>4}{r['val_accuracy']:>9.3f}{r['train_accuracy']:>10.3f}{r['n_working']:>8}"
                 f"{r['n_criteria']:>9}{r['added']:>4}{r['rewritten']:>4}{r['deleted']:>4}{r['reweighted']:>4}"
                 f"  {r.get('stop') or ''}")
    return '\n'.join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', type=Path, default=runs_dir() / 'bench' / 'induction')
    ap.add_argument('--pool', type=Path, default=None, help="the pool to induce (default OUT/induced-synth.yaml)")
    ap.add_argument('--dev-videos', type=int, default=SYNTH_POOL['synth']['videos'])
    ap.add_argument('--test-videos', type=int, default=22)
    ap.add_argument('--max-iters', type=int, default=SYNTH_POOL['max_iters'])
    ap.add_argument('--backend', default='embedded')
    ap.add_argument('--concurrency', type=int, default=1)
    ap.add_argument('--teacher-questions', type=int, default=20)
    a = ap.parse_args()
    a.pool = a.pool or a.out / 'induced-synth.yaml'
    recipe = dict(SYNTH_POOL, path=str(a.pool), root=str(a.out / 'data_dev'), max_iters=a.max_iters,
                  synth=dict(SYNTH_POOL['synth'], videos=a.dev_videos))
    test, seed_pool = data(a.out, 'test', a.test_videos), default_pool_path()
    t = time.time()
    ensure_pool(recipe, progress=True)
    rep = json.loads(a.pool.with_suffix('.report.json').read_text())
    walls = {'induce': time.time() - t}
    dev = a.out / 'data_dev'
    print(show_pool(a.pool))
    committed = project_root() / SYNTH_POOL['path']
    same = committed.exists() and RubricPool.load(committed).to_yaml() == RubricPool.load(a.pool).to_yaml()
    print(f"criteria and weights {'equal' if same else 'differ from'} the committed {committed}")
    print('filter:', json.dumps(rep['filter']))
    print(curve(rep))
    runs = {}
    for name, pool in (('seed', seed_pool), ('induced', a.pool)):
        w = pool_eval_warning(pool, 'synth', 'test')
        if w: print('WARNING:', w)
        t = time.time()
        runs[name] = run_eval('synth', 'reveal', a.out / 'eval' / f'run_reveal_{name}', root=test, backend=a.backend,
                              concurrency=a.concurrency, overrides=[f'rubric_pool={pool}'])
        walls[f'eval_{name}'] = time.time() - t
        print(name, json.dumps(runs[name]))
    c = compare_runs(a.out / 'eval' / 'run_reveal_induced', a.out / 'eval' / 'run_reveal_seed')
    print(format_compare(c))
    ta = teacher_agreement_child(dev, a.teacher_questions, a.backend)
    print('model teacher E+ vs oracle:', json.dumps(ta))
    atomic_write_json(a.out / 'induction_bench.json', dict(filter=rep['filter'], iterations=rep['iterations'],
                                                           runs=runs, compare=c, teacher=ta, walls=walls,
                                                           provenance=rep['provenance'], equals_committed=same))


if __name__ == '__main__':
    main()
