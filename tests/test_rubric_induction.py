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
from reveal_kit.eval.runner import induce_benchmark
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
    generate_benchmark(root, minutes=1.0, videos=3, questions_per_video=6, seed=5, split='dev', render=False,
                       progress=False)
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
