"""Integration tests of rubric induction (reveal_kit.reveal.pairs, .proposers, .induction: nbs/26*_reveal.*.ipynb).

A tiny generated benchmark (not rendered) with memories made from each video's script (one L1 item per scripted
event), so the oracle's labels can be checked against the generator's own record of which events are decisive, the
induced pool can be used by the loop, and a run killed between iterations can be resumed.
"""
from __future__ import annotations
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reveal_kit.reveal.agent import answer_question
from reveal_kit.core import MemoryItem
from reveal_kit.io import read_jsonl_rows
from reveal_kit.reveal.pairs import ModelTeacher, OracleTeacher, candidates, teacher_agreement
from reveal_kit.reveal.proposers import OfflineProposer
from reveal_kit.reveal.induction import SplitRefused, induce, read_provenance, show_pool
from reveal_kit.eval.induce import induce_benchmark
from reveal_kit.reveal.rubrics import RubricPool
from reveal_kit.backends.chat import ScriptedModel
from reveal_kit.synth.bench import generate_benchmark, load_questions
from reveal_kit.testing.fakes import HashEmbedder, TinyMemory

EMB = HashEmbedder()


def script_memory(root: Path, q) -> TinyMemory:
    "One L1 item per scripted event (its id is the event id), one L2 and one L3 summary."
    tl = json.loads((root / q.meta['timeline_path']).read_text())
    l1 = [MemoryItem(e['eid'], 1, e['t_start'], e['t_end'], f"the {e['entity'].replace('_', ' ')} {e['action']}s the "
                     f"{e['obj']}") for e in tl['events']]
    return TinyMemory(l1 + [MemoryItem('L2', 2, 0, tl['duration'], 'events'),
                            MemoryItem('L3', 3, 0, tl['duration'], 'a video')], EMB)


@pytest.fixture(scope='module')
def bench(tmp_path_factory):
    root = tmp_path_factory.mktemp('ind') / 'dev'
    generate_benchmark(root, minutes=2.0, videos=4, questions_per_video=8, seed=5, split='dev', render=False,
                       progress=False)                        # 18 questions, about 10 contrastive pairs
    mems = {}
    return root, load_questions(root), lambda q: mems.setdefault(q.video_id, script_memory(root, q))


def test_oracle_matches_generator_record(bench):
    "E⁺ = the candidates that are the generator's evidence events; E⁻ only distractor events."
    root, qs, mem = bench
    for q in qs:
        cands = candidates(q, mem(q))
        lab = OracleTeacher().label(q, cands)
        ids = {c.item_id for c in cands}
        assert set(lab.pos) == set(q.meta['evidence_events']) & ids, q.qid
        assert set(lab.neg) <= set(q.meta['distractor_events']), q.qid


def test_model_teacher_scored_against_oracle(bench):
    root, qs, mem = bench
    q = qs[0]
    cands = candidates(q, mem(q))
    gold = OracleTeacher().label(q, cands).pos
    idx = [i for i, c in enumerate(cands) if c.item_id in gold]
    exact = ModelTeacher(ScriptedModel(lambda m, s, r: {'decisive': idx, 'misleading': []})).label(q, cands)
    everything = ModelTeacher(ScriptedModel(lambda m, s, r: {'decisive': list(range(min(16, len(cands)))),
                                                             'misleading': []})).label(q, cands)
    assert teacher_agreement({q.qid: exact.pos}, {q.qid: gold})['precision'] == 1.0
    ag = teacher_agreement({q.qid: everything.pos}, {q.qid: gold})
    assert ag['recall'] == 1.0 and ag['precision'] < 1.0


def test_refuses_generated_test_split(tmp_path):
    root = tmp_path / 'test'
    generate_benchmark(root, minutes=1.0, videos=1, questions_per_video=4, seed=5, split='test', render=False,
                       progress=False)
    with pytest.raises(SplitRefused, match='test split'):
        induce_benchmark('synth', root=root, split=None, out=tmp_path / 'p.yaml', text_embedder=EMB, work_dir=tmp_path,
               progress=False)
    assert not (tmp_path / 'p.yaml').exists()


def test_induced_pool_drives_the_loop(bench, tmp_path, monkeypatch):
    "The written pool is what the agent's verifier selects criteria from when `$REVEAL_RUBRICS` points at it."
    root, qs, mem = bench
    out = tmp_path / 'rubrics' / 'induced-t.yaml'
    rep = induce(qs, split='dev', out=out, memories=mem, text_embedder=EMB, max_iters=2, work_dir=tmp_path / 'w',
                 progress=False)
    pool = RubricPool.load(out)
    assert read_provenance(out)['split'] == 'dev' and not pool.seed
    assert rep['filter']['candidates'] == len(qs)
    assert 'induced' in show_pool(out).splitlines()[0]
    monkeypatch.setenv('REVEAL_RUBRICS', str(out))
    res = answer_question(qs[0], mem(qs[0]), preset='reveal', return_trace=True)
    assert res['trace_data']['criteria']['names'] and set(res['trace_data']['criteria']['names']) <= set(pool.names)


KILLER = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_rubric_induction import script_memory, EMB
from reveal_kit.synth.bench import load_questions
from reveal_kit.reveal import induction as ri
root = Path({root!r})
qs = load_questions(root)
orig = ri.append_jsonl
def append_then_die(path, row):
    orig(path, row)
    if Path(path).name == 'iterations.jsonl' and row['iteration'] == 1:
        os.kill(os.getpid(), signal.SIGKILL)
ri.append_jsonl = append_then_die
mems = {{}}
ri.induce(qs, split='dev', out={out!r}, memories=lambda q: mems.setdefault(q.video_id, script_memory(root, q)),
          text_embedder=EMB, max_iters=4, patience=9, work_dir={work!r}, progress=False)
"""


def test_resume_after_kill(bench, tmp_path):
    "A process killed (SIGKILL) right after iteration 1 is recorded; the rerun continues from iteration 2."
    root, qs, mem = bench
    out = tmp_path / 'induced-k.yaml'
    work = tmp_path / 'induced-k.work'
    code = KILLER.format(tests=str(Path(__file__).parent), root=str(root), out=str(out), work=str(work))
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env={**os.environ})
    assert p.returncode == -9, p.stderr[-2000:]
    rows = read_jsonl_rows(tmp_path / 'induced-k.work' / 'iterations.jsonl')
    assert [r['iteration'] for r in rows] == [0, 1]
    assert not out.exists()
    n_pairs = len(read_jsonl_rows(tmp_path / 'induced-k.work' / 'pairs.jsonl'))
    prop = _Counting()
    rep = induce(qs, split='dev', out=out, teacher=_Never(), proposer=prop, memories=mem, text_embedder=EMB,
                 max_iters=4, patience=9, work_dir=work, progress=False)
    its = [r['iteration'] for r in rep['iterations']]
    assert its[:2] == [0, 1] and its == list(range(len(its)))
    assert prop.n == len(its) - 2                       # iteration 1 was not proposed again
    assert rep['iterations'][1] == rows[1]
    assert len(read_jsonl_rows(tmp_path / 'induced-k.work' / 'pairs.jsonl')) == n_pairs
    assert out.exists()


class _Counting(OfflineProposer):
    def __init__(self):
        super().__init__()
        self.n = 0

    def propose(self, *a):
        self.n += 1
        return super().propose(*a)


class _Never:
    "Stands in for the killed run's oracle teacher (the same name, so the work folder resumes); must not be asked."
    name = 'oracle'

    def label(self, q, c):
        raise AssertionError('the teacher was asked again after resuming')


# ---------------------------------------------------------------- induction as App. B.4 / Fig. 3 (issue 21, item 10)
from reveal_kit.reveal.induction import split_pairs
from reveal_kit.reveal.pairs import Pair, pair_views, separation
from reveal_kit.reveal.proposers import check_table
from reveal_kit.reveal.rubrics import Criterion, load_rubric_pool
from reveal_kit.reveal.rubrics import OFFLINE_CHECKS
import numpy as np

_B = {'1': 'all', '0.5': 'some', '0': 'none'}


class _Fixed:
    "A proposer that returns `make(pool)` and records the qids of every working set it was given."
    name = 'fixed'

    def __init__(self, make):
        self.make, self.working = make, []

    def propose(self, pool, working, context, views):
        self.working.append([p.qid for p in working])
        return self.make(pool), {}


def _kept(work: Path) -> list[Pair]:
    return [p for p in (Pair.from_dict(r) for r in read_jsonl_rows(work / 'pairs.jsonl')) if p.kept]


def test_next_working_set_is_the_misjudged_held_out_pairs(bench, tmp_path):
    "Fig. 3: after iteration 1 (all training pairs), the proposer works on the held-out pairs the pool misjudged."
    root, qs, mem = bench
    bad = RubricPool([Criterion('coverage_only', 'Evidence spans the video.', 1.0, _B, ['all'], [], 'coverage')])
    prop = _Fixed(lambda pool: bad)
    rep = induce(qs, split='dev', out=tmp_path / 'p.yaml', proposer=prop, memories=mem, text_embedder=EMB,
                 max_iters=2, patience=9, work_dir=tmp_path / 'w', progress=False)
    train, val = split_pairs(_kept(tmp_path / 'w'))
    assert prop.working[0] == [p.qid for p in train]
    misjudged = [r['qid'] for r in separation(bad, val, pair_views(val, EMB.encode)) if not r['correct']]
    assert misjudged, 'the fixture must leave a held-out pair misjudged'
    assert rep['iterations'][1]['next_working'] == misjudged
    assert prop.working[1] == misjudged and set(misjudged) <= {p.qid for p in val}


def test_the_start_pool_is_selected_when_nothing_beats_it(bench, tmp_path):
    "B.4: a proposal that does not beat the seed on validation leaves the seed (iteration 0) as the chosen pool."
    root, qs, mem = bench
    prop = _Fixed(lambda pool: RubricPool(list(pool.criteria), pool.name))      # validates exactly as the start pool
    rep = induce(qs, split='dev', out=tmp_path / 'p.yaml', proposer=prop, memories=mem, text_embedder=EMB,
                 max_iters=2, patience=9, work_dir=tmp_path / 'w', progress=False)
    accs = [r['val_accuracy'] for r in rep['iterations']]
    assert len(set(accs)) == 1 and len(accs) >= 2
    assert rep['best_iteration'] == 0 and read_provenance(tmp_path / 'p.yaml')['iteration'] == 0
    assert RubricPool.load(tmp_path / 'p.yaml').names == load_rubric_pool().names


def _single_rho(pairs, views, check: str) -> list[tuple[float, float]]:
    "ρ⁺ and ρ⁻ of a one-criterion pool of `check` on each pair: max over options of the check's score."
    i = OFFLINE_CHECKS.index(check)
    return [tuple(float(check_table(p.question, v, len(p.question.options))[:, i].max()) for v in views[p.qid])
            for p in pairs]


def test_a_proposed_criterion_that_separates_none_of_its_pairs_is_rejected(bench, tmp_path):
    "B.4: each proposed criterion must separate E⁺ from E⁻ on its own pair; one that does not is not added."
    root, qs, mem = bench
    induce(qs, split='dev', out=tmp_path / 'p0.yaml', proposer=_Fixed(lambda p: p), memories=mem, text_embedder=EMB,
           max_iters=1, work_dir=tmp_path / 'w0', progress=False)
    train, _ = split_pairs(_kept(tmp_path / 'w0'))
    views = pair_views(train, EMB.encode)
    table = {c: _single_rho(train, views, c) for c in OFFLINE_CHECKS}
    sep = [c for c in OFFLINE_CHECKS if any(a > b for a, b in table[c])]
    never = [c for c in OFFLINE_CHECKS if not any(a > b for a, b in table[c])]
    assert sep and never, 'the fixture must have a check that separates some training pair and one that separates none'
    add = [Criterion('proposed_good', 'It separates.', 1.0, _B, ['all'], [], sep[0]),
           Criterion('proposed_never', 'It never separates.', 1.0, _B, ['all'], [], never[0])]
    prop = _Fixed(lambda pool: RubricPool(list(pool.criteria) + add, pool.name))
    rep = induce(qs, split='dev', out=tmp_path / 'p.yaml', proposer=prop, memories=mem, text_embedder=EMB,
                 max_iters=1, work_dir=tmp_path / 'w', progress=False)
    it1 = RubricPool.load(tmp_path / 'w' / 'pool_iter1.yaml')
    assert 'proposed_good' in it1 and 'proposed_never' not in it1
    assert [r['name'] for r in rep['iterations'][1]['rejected']] == ['proposed_never']
