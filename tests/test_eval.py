"""Evaluation harness: official-format loaders, data check, resumable/sharded runner, metrics, `reveal eval` CLI."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from reveal_kit.core import Question
from reveal_kit.eval import loaders as L
from reveal_kit.eval.annotations import AnnotationError, extract_options
from reveal_kit.eval.data_check import check_data
from reveal_kit.testing.annotation_files import write_fixture
from reveal_kit.testing.videos import make_test_video
from reveal_kit.eval.methods import register_method
from reveal_kit.eval.runner import run_eval
from reveal_kit.eval.run_dir import select_questions, RunLocked
from reveal_kit.core import RunMismatch
from reveal_kit.eval.metrics import load_results, report, compare, mcnemar_exact, paired_bootstrap_ci

ROOT = Path(__file__).resolve().parent.parent
PETS = {'A': 'a cat', 'B': 'a dog', 'C': 'two birds', 'D': 'a fish'}


# ---------------------------------------------------------------- loaders, one official-format fixture each

def _w(p: Path, text: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_videomme_parquet_list_options(tmp_path):
    rows = [dict(video_id='001', duration='long', domain='Knowledge', sub_category='History', url='u', videoID='fFjv93ACGo8',
                 question_id='001-1', task_type='Counting Problem', question='Which pet is shown?',
                 options=['A. a cat', 'B. a dog', 'C. two birds', 'D. a fish'], answer='B'),
            dict(video_id='002', duration='short', domain='Knowledge', sub_category='History', url='u', videoID='x2',
                 question_id='002-1', task_type='OCR Problems', question='Text?', options=['A. 1', 'B. 2', 'C. 3', 'D. 4'], answer='A')]
    (tmp_path / 'videomme').mkdir()
    pd.DataFrame(rows).to_parquet(tmp_path / 'videomme' / 'test-00000-of-00001.parquet')
    qs, rep = L.load_videomme(tmp_path)                       # long split by default
    assert (rep.loaded, rep.skipped) == (1, 0)
    q = qs[0]
    assert (q.qid, q.video_id, q.options, q.answer, q.qtype, q.duration_group) == ('001-1', 'fFjv93ACGo8', PETS, 'B', 'Counting Problem', 'long')
    assert q.video_path == str(tmp_path / 'data' / 'fFjv93ACGo8.mp4') and q.subtitle_path.endswith('subtitle/fFjv93ACGo8.srt')
    assert len(L.load_videomme(tmp_path, split='all')[0]) == 2


def test_lvbench_jsonl_inline_options(tmp_path):
    rec = dict(key='aBcD', type='cartoon', video_info=dict(duration_minutes=65.0, fps=25.0),
               qa=[dict(uid='7', question='Which pet is shown?\n(A) a cat\n(B) a dog\n(C) two birds\n(D) a fish', answer='C',
                        question_type=['entity recognition', 'temporal grounding'], time_reference='01:05-01:12')])
    _w(tmp_path / 'video_info.meta.jsonl', json.dumps(rec) + '\n')
    qs, rep = L.load_lvbench(tmp_path)
    q = qs[0]
    assert (q.qid, q.video_id, q.question, q.options, q.answer) == ('7', 'aBcD', 'Which pet is shown?', PETS, 'C')
    assert (q.qtype, q.duration, q.duration_group, q.evidence_spans) == ('entity recognition', 3900.0, 'hour+', [(65.0, 72.0)])
    assert q.meta['question_types'] == ['entity recognition', 'temporal grounding']


def test_longvideobench_json_candidates_and_parquet_fields(tmp_path):
    rec = dict(video_id='v1', id='v1_0', video_path='v1.mp4', subtitle_path='v1_en.json', question='Which pet is shown?',
               candidates=list(PETS.values()), correct_choice=1, duration=420.0, duration_group=600, question_category='S2E',
               topic_category='KS', starting_timestamp_for_subtitles=3.0)
    _w(tmp_path / 'lvb_val.json', json.dumps([rec]))
    qs, _ = L.load_longvideobench(tmp_path)
    q = qs[0]
    assert (q.qid, q.options, q.answer, q.qtype, q.duration_group) == ('v1_0', PETS, 'B', 'S2E', 'medium')
    assert q.meta['lvb_duration_group'] == '600'
    assert q.subtitle_path == str(tmp_path / 'subtitles' / 'v1_en.json')
    # the parquet release: option0..option4 as separate fields
    sep = {k: v for k, v in rec.items() if k != 'candidates'} | {f'option{i}': v for i, v in enumerate(PETS.values())}
    (tmp_path / 'pq').mkdir()
    pd.DataFrame([sep]).to_parquet(tmp_path / 'pq' / 'validation-00000-of-00001.parquet')
    q2 = L.load_longvideobench(tmp_path / 'pq')[0][0]
    assert (q2.options, q2.answer) == (PETS, 'B')


def test_egoschema_separate_option_fields_and_subset(tmp_path):
    qs = [{'q_uid': u, 'google_drive_id': 'g', 'question': 'Which pet is shown?', **{f'option {i}': v for i, v in enumerate(PETS.values())}}
          for u in ('u1', 'u2')]
    _w(tmp_path / 'questions.json', json.dumps(qs))
    _w(tmp_path / 'subset_answers.json', json.dumps({'u1': 3}))
    sub, rep = L.load_egoschema(tmp_path)
    assert [(q.qid, q.options, q.answer) for q in sub] == [('u1', PETS, 'D')]
    full, _ = L.load_egoschema(tmp_path, split='full')
    assert [q.answer for q in full] == ['D', None]


def test_mmrv_paren_options(tmp_path):
    rec = dict(video='Some Show.mp4', videoType='TV', question='Which pet is shown?', options=[f'({k}) {v}' for k, v in PETS.items()],
               correctAnswer='(A)', abilityType_L2='Counterintuitive Reasoning', abilityType_L3='x', question_idx=3)
    _w(tmp_path / 'mmrv.json', json.dumps([rec]))
    q = L.load_mmrv(tmp_path)[0][0]
    assert (q.options, q.answer, q.video_id, q.qtype) == (PETS, 'A', 'Some Show', 'Counterintuitive Reasoning')


def test_egolifeqa_choice_fields_and_times(tmp_path):
    rec = dict(ID='12', query_time=dict(date='DAY3', time='20000000'), type='EventRecall', need_audio=False, need_name=False,
               last_time=True, question='Which pet is shown?', choice_a='a cat', choice_b='a dog', choice_c='two birds', choice_d='a fish',
               answer='D', target_time=dict(date='DAY1', time='11152408'), keywords='hint')
    _w(tmp_path / 'EgoLifeQA' / 'EgoLifeQA_A1_JAKE.json', json.dumps([rec]))
    q = L.load_egolifeqa(tmp_path)[0][0]
    assert (q.qid, q.video_id, q.options, q.answer, q.qtype) == ('egolife_A1_JAKE_12', 'A1_JAKE', PETS, 'D', 'EventRecall')
    assert q.meta['query_seconds'] == 2 * 86400 + 20 * 3600
    assert q.evidence_spans == [(11 * 3600 + 15 * 60 + 24 + 0.4,) * 2] and 'keywords' not in q.meta


def test_synth_questions_jsonl(tmp_path):
    q = Question('s1', 'v0', 'Which pet is shown?', list(PETS.values()), answer='C', video_path='videos/v0.mp4', subtitle_path='videos/v0.srt')
    _w(tmp_path / 'questions.jsonl', json.dumps(q.to_dict()) + '\n')
    (got,), rep = L.load_synth(tmp_path)
    assert got.options == PETS and got.video_path == str((tmp_path / 'videos' / 'v0.mp4').resolve()) and rep.loaded == 1


def test_the_three_option_shapes_give_the_same_question():
    recs = [{'question': 'Which pet is shown?', 'options': [f'{k}. {v}' for k, v in PETS.items()]},
            {'question': 'Which pet is shown?', 'option 0': 'a cat', 'option 1': 'a dog', 'option 2': 'two birds', 'option 3': 'a fish'},
            {'question': 'Which pet is shown? A. a cat B. a dog C. two birds D. a fish'}]
    assert {json.dumps(extract_options(r)) for r in recs} == {json.dumps(('Which pet is shown?', PETS))}


def test_truncated_file_names_file_and_record(tmp_path):
    recs = [dict(id=f'v_{i}', video_id='v', video_path='v.mp4', question='q?', candidates=['a', 'b'], correct_choice=0) for i in range(4)]
    text = json.dumps(recs)
    p = _w(tmp_path / 'lvb_val.json', text[:int(len(text) * 0.6)])
    with pytest.raises(AnnotationError, match=r'lvb_val\.json: malformed JSON at record 2'):
        L.load_longvideobench(tmp_path)
    _w(tmp_path / 'video_info.meta.jsonl', '{"key": "a", "qa": []}\n{"key": "b", "qa": [')
    with pytest.raises(AnnotationError, match=r'video_info\.meta\.jsonl: malformed JSON on line 2'):
        L.load_lvbench(tmp_path)


def test_bad_records_are_counted_not_dropped(tmp_path):
    good = dict(id='ok', video_id='v', video_path='v.mp4', question='q?', candidates=['a', 'b'], correct_choice=1)
    bad = [dict(good, id='bad-gold', correct_choice=5), {k: v for k, v in good.items() if k != 'candidates'} | {'id': 'no-options'},
           {k: v for k, v in good.items() if k != 'id'}]
    _w(tmp_path / 'lvb_val.json', json.dumps([good] + bad))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        qs, rep = L.load_longvideobench(tmp_path)
    assert (rep.loaded, rep.skipped, len(rep.reasons)) == (1, 3, 3)
    assert 'record 1 (bad-gold)' in rep.reasons[0] and 'out of range' in rep.reasons[0]
    assert "missing field 'id'" in rep.reasons[2]
    assert any('skipped 3' in str(x.message) for x in w)


def test_a_repeated_qid_is_refused_naming_both_records_or_renamed(tmp_path, monkeypatch):
    "Two questions under one id would share a trace and count twice: refused in one line, or renamed by choice."
    good = dict(id='ok', video_id='v', video_path='v.mp4', question='q?', candidates=['a', 'b'], correct_choice=1)
    _w(tmp_path / 'lvb_val.json', json.dumps([good, dict(good, correct_choice=0)]))
    with pytest.raises(ValueError, match=r"record 0 \(ok\) and .*record 1 \(ok\) share the qid 'ok'"):
        L.load_longvideobench(tmp_path)
    monkeypatch.setenv('REVEAL_DUPLICATE_QIDS', 'rename')
    qs, rep = L.load_longvideobench(tmp_path)
    assert [q.qid for q in qs] == ['ok', 'ok#2'] and [q.answer for q in qs] == ['B', 'A']


# ---------------------------------------------------------------- data check

def test_data_check_on_a_partial_root(tmp_path):
    root = write_fixture('lvbench', tmp_path / 'lv')            # 2 questions, 1 video present
    (root / 'videos' / 'vidA.mp4').unlink()
    r = check_data('lvbench', root)
    assert (r['loaded'], r['expected_questions'], r['videos'], r['videos_present'], r['videos_missing']) == (2, 1549, 1, 0, 1)
    assert r['status'] == 'incomplete' and r['annotations'][0]['present']
    r = check_data('egoschema', tmp_path / 'nothing')
    assert r['status'] == 'missing annotations' and 'no annotation file' in r['error']


def test_data_check_cli(tmp_path):
    from reveal_kit.cli.main import app
    res = CliRunner().invoke(app, ['data', 'check', 'videomme', '--root', str(write_fixture('videomme', tmp_path / 'vm')),
                                   '--json'])
    out = json.loads(res.output)
    assert res.exit_code == 1 and (out['loaded'], out['videos_present'], out['subtitles_present']) == (2, 1, 1)
    res = CliRunner().invoke(app, ['data', 'check', 'lvbench', '--root', str(write_fixture('lvbench', tmp_path / 'lv'))])
    assert res.exit_code == 1 and 'questions: 2 loaded (expected 1549)' in res.output, res.output
    assert CliRunner().invoke(app, ['data', 'check', 'nope', '--root', str(tmp_path)]).exit_code == 2


# ---------------------------------------------------------------- runner: resume after a kill, shards

SCRIPT = textwrap.dedent('''
    import sys, time
    from reveal_kit.core import Question
    from reveal_kit.eval.methods import register_method
    from reveal_kit.eval.runner import run_eval

    @register_method('slow')
    def slow(q, ctx):
        time.sleep(0.08)
        return {'answer': 'AB'[int(q.qid[1:]) % 2], 'rounds': 1 + int(q.qid[1:]) % 3}

    qs = [Question(f'q{k}', f'v{k // 4}', f'question {k}?', ['x', 'y'], answer='A') for k in range(int(sys.argv[2]))]
    run_eval(qs, 'slow', sys.argv[1], backend='none', concurrency=3, progress=False)
''')


def _spawn(script: Path, out: Path, n: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return subprocess.Popen([sys.executable, str(script), str(out), str(n)], cwd=ROOT, env=env)


def test_resume_after_kill_loses_nothing_and_duplicates_nothing(tmp_path):
    script, out, n = _w(tmp_path / 'run.py', SCRIPT), tmp_path / 'run', 120
    res = out / 'results.jsonl'
    p = _spawn(script, out, n)
    t0 = time.time()
    while time.time() - t0 < 60:
        if res.exists() and len(res.read_text().splitlines()) >= 15: break
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    before = len(res.read_text().splitlines())
    assert 15 <= before < n, before
    with open(res, 'a') as f: f.write('{"qid": "q9999", "answer": "A", "corr')      # a write cut by the kill
    assert _spawn(script, out, n).wait(timeout=120) == 0
    lines = res.read_text().splitlines()
    qids = [json.loads(l)['qid'] for l in lines]
    assert len(qids) == n and set(qids) == {f'q{k}' for k in range(n)}                  # none lost, none duplicated
    rep = report(load_results(out))
    assert rep['n'] == n and rep['correct'] == n // 2 and rep['failed'] == 0
    assert json.loads((out / 'run.json').read_text())['last_invocation']['repaired_lines'] == 1


@register_method('_const_b')
def _const_b(q, ctx): return {'answer': 'B', 'rounds': 1}


def test_shards_cover_every_question_exactly_once(tmp_path):
    qs = [Question(f'q{k}', f'video{k % 7}', f'question {k}?', ['x', 'y'], answer='B') for k in range(50)]
    seen = []
    for i in range(4):
        run_eval(qs, '_const_b', tmp_path / f's{i}', shard=f'{i}/4', backend='none', progress=False)
        seen += [r['qid'] for r in load_results(tmp_path / f's{i}')]
    assert sorted(seen) == sorted(q.qid for q in qs)
    vids = [{r['video_id'] for r in load_results(tmp_path / f's{i}')} for i in range(4)]
    assert sum(len(v) for v in vids) == 7                                          # a video lives in one shard only
    assert [q.qid for q in select_questions(qs, limit=10, shard=(0, 1))] == [f'q{k}' for k in range(10)]


def test_failed_questions_are_recorded_not_guessed(tmp_path):
    @register_method('_flaky')
    def _flaky(q, ctx):
        if q.qid == 'q1': raise RuntimeError('model server went away')
        return {'answer': 'A'}
    qs = [Question(f'q{k}', 'v', f'question {k}?', ['x', 'y'], answer='A') for k in range(3)]
    s = run_eval(qs, '_flaky', tmp_path, backend='none', progress=False)
    recs = {r['qid']: r for r in load_results(tmp_path)}
    assert s['failed'] == 1 and recs['q1']['answer'] is None and recs['q1']['failed'] and 'model server went away' in recs['q1']['error']
    assert Path(recs['q1']['trace']).read_text().count('RuntimeError') >= 1
    assert run_eval(qs, '_flaky', tmp_path, backend='none', progress=False)['ran'] == 0
    assert run_eval(qs, '_flaky', tmp_path, backend='none', progress=False, retry_failed=True)['ran'] == 1
    assert len(load_results(tmp_path)) == 3


# ---------------------------------------------------------------- metrics on hand-made results

def test_metric_arithmetic():
    def R(qid, ans, gold, qt, dg, rounds, **kw):
        return dict(qid=qid, answer=ans, gold=gold, correct=ans == gold, qtype=qt, duration_group=dg, rounds=rounds,
                    llm_calls=2 * rounds, prompt_tokens=300, completion_tokens=30, seconds=2.0, stop_reason='sufficient', **kw)
    a = [R('1', 'A', 'A', 'count', 'long', 1), R('2', 'B', 'A', 'count', 'long', 3), R('3', 'C', 'C', 'order', 'short', 2),
         R('4', None, 'D', 'order', 'short', 1), R('5', None, 'A', 'order', 'long', 0, failed=True, error='X: y')]
    rep = report(a)
    assert (rep['n'], rep['correct'], rep['accuracy'], rep['unparseable'], rep['failed']) == (5, 2, 0.4, 1, 1)
    assert rep['by_qtype']['order'] == dict(n=3, correct=1, accuracy=1 / 3)
    assert rep['by_duration_group']['long'] == dict(n=3, correct=1, accuracy=1 / 3)
    assert rep['rounds_hist'] == {'1': 2, '2': 1, '3': 1} and rep['rounds_mean'] == 7 / 4
    assert rep['llm_calls_mean'] == 14 / 5 and rep['prompt_tokens_mean'] == 300 and rep['seconds_mean'] == 2.0
    b = [dict(r, answer=r['gold'], correct=True) for r in a[:4]] + [dict(a[4], failed=False, answer='A', correct=True)]
    c = compare(a, b, seed=7, n_boot=4000)
    assert (c['n_common'], c['excluded_failed'], c['both_correct'], c['only_a_correct'], c['only_b_correct']) == (4, 1, 2, 0, 2)
    assert c['accuracy_diff'] == -0.5 and c['mcnemar_p'] == 0.5                       # binomtest(0, 2, .5): p = 2 * .25
    assert c['bootstrap_ci95'] == compare(a, b, seed=7, n_boot=4000)['bootstrap_ci95']
    assert abs(mcnemar_exact(9, 1) - 0.021484375) < 1e-12
    lo, hi = paired_bootstrap_ci([1] * 30 + [0] * 70, [0] * 100, seed=0)
    assert 0.2 < lo < 0.3 < hi < 0.4


# ---------------------------------------------------------------- the CLI: bare, run, report, compare

def test_eval_cli_three_forms(tmp_path):
    from reveal_kit.cli.main import app
    root = write_fixture('synth', tmp_path / 'data')
    cli = CliRunner()
    base = ['--root', str(root), '--backend', 'none', '--quiet']
    r = cli.invoke(app, ['eval', 'synth', '--method', '_const_b', '--out', str(tmp_path / 'a')] + base)
    assert r.exit_code == 0 and '4 run' in r.output, r.output
    r = cli.invoke(app, ['eval', 'run', 'synth', '--method', '_const_b', '--out', str(tmp_path / 'a'), '--limit', '2'] + base)
    assert r.exit_code == 0 and '0 run, 2 already done' in r.output, r.output   # limit is not part of the run's identity
    r = cli.invoke(app, ['eval', 'run', 'synth', '-m', 'blind', '-o', str(tmp_path / 'b')] + base)
    assert r.exit_code == 0, r.output
    r = cli.invoke(app, ['eval', 'synth', '--method', 'nope', '--out', str(tmp_path / 'x')] + base)
    assert r.exit_code == 2 and 'unknown method' in r.output, r.output
    r = cli.invoke(app, ['eval', 'report', str(tmp_path / 'a'), '--json'])
    rep = json.loads(r.output)
    assert r.exit_code == 0 and rep['n'] == 4 and rep['accuracy'] == 1.0
    assert 'accuracy 100.0 %' in cli.invoke(app, ['eval', 'report', str(tmp_path / 'a')]).output
    r = cli.invoke(app, ['eval', 'compare', str(tmp_path / 'a'), str(tmp_path / 'b'), '--json'])
    c = json.loads(r.output)
    assert r.exit_code == 0 and c['n_common'] == 4 and 'mcnemar_p' in c
    assert 'McNemar exact p' in cli.invoke(app, ['eval', 'compare', str(tmp_path / 'a'), str(tmp_path / 'b')]).output
    assert cli.invoke(app, ['eval', 'report', str(tmp_path / 'nothing')]).exit_code == 2


def test_rerun_with_other_config_is_refused(tmp_path):
    qs = [Question('q0', 'v', 'question?', ['x', 'y'], answer='B')]
    run_eval(qs, '_const_b', tmp_path, backend='none', progress=False)
    with pytest.raises(RunMismatch, match='other settings'):
        run_eval(qs, '_const_b', tmp_path, backend='none', progress=False, overrides=['tau=0.5'])


# ---------------------------------------------------------------- end to end: generated benchmark, offline roles

@pytest.mark.slow
def test_end_to_end_generated_benchmark_offline_roles(tmp_path, monkeypatch):
    from reveal_kit.synth.bench import generate_benchmark
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))                     # memories and caches stay in tmp
    root = tmp_path / 'data'
    generate_benchmark(root, minutes=1, videos=1, questions_per_video=3, seed=0, progress=False)
    qs, rep = L.load_synth(root)
    assert rep.skipped == 0 and len(qs) >= 2
    chk = check_data('synth', root)
    assert chk['videos_missing'] == 0 and chk['loaded'] == len(qs) and chk['expected_questions'] == len(qs)
    results = {}
    for m in ('blind', 'direct', 'base', 'reveal'):
        s = run_eval('synth', m, tmp_path / m, root=root, backend='embedded', concurrency=2, progress=False)
        assert (s['ran'], s['failed']) == (len(qs), 0), (m, s)
        results[m] = {r['qid']: r for r in load_results(tmp_path / m)}
        assert set(results[m]) == {q.qid for q in qs}
        for q in qs:
            r = results[m][q.qid]
            assert r['answer'] in q.options and r['gold'] == q.answer and Path(r['trace']).exists(), (m, r)
        meta = json.loads((tmp_path / m / 'run.json').read_text())
        assert meta['method'] == m and meta['config_hash'] and meta['kit_version'] and meta['git_commit']
    assert all(1 <= r['rounds'] <= 3 for r in results['reveal'].values())
    assert all(r['rounds'] == 1 for r in results['base'].values())
    assert all(r['evidence'] == [] and r['text'] is None for r in results['direct'].values())   # frames, no captions
    c = compare(results['reveal'].values(), results['base'].values(), n_boot=500)
    assert c['n_common'] == len(qs) and 0 <= c['mcnemar_p'] <= 1
    assert run_eval('synth', 'reveal', tmp_path / 'reveal', root=root, backend='embedded', progress=False)['ran'] == 0


def test_only_present_videos(tmp_path):
    root = write_fixture('synth', tmp_path / 'data')                           # only videos/v0.mp4 exists
    s = run_eval('synth', '_const_b', tmp_path / 'run', root=root, backend='none', only_present=True, progress=False)
    assert s['selected'] == 2 and {r['video_id'] for r in load_results(tmp_path / 'run')} == {'v0'}
    with pytest.raises(ValueError, match='takes no'):
        run_eval('lvbench', '_const_b', tmp_path / 'x', root=root, split='val', backend='none', progress=False)
    from reveal_kit.cli.main import app
    (root / 'videos' / 'v0.mp4').unlink()                                        # now no video is present
    res = CliRunner().invoke(app, ['eval', 'run', 'synth', '--method', '_const_b', '--root', str(root), '--out',
                                   str(tmp_path / 'none'), '--backend', 'none', '--only-present', '--quiet'])
    assert res.exit_code == 2 and "questions' videos is present (e.g." in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / 'none' / 'results.jsonl').exists()


# ---------------------------------------------------------------- option letters as the source gives them

def test_out_of_order_letters_are_kept_never_relettered():
    q = Question('d', 'v', 'What happens first?', ['B. drops the drum', 'A. kicks the drum'], answer='A')
    assert q.options == {'B': 'drops the drum', 'A': 'kicks the drum'} and q.options['A'] == 'kicks the drum'
    assert q.options_text() == 'B. drops the drum\nA. kicks the drum'
    with pytest.raises(ValueError, match='carries the letter A'):
        Question('d', 'v', 'q?', ['drops the drum', 'A. kicks the drum'])
    with pytest.raises(ValueError, match='given twice'):
        Question('d', 'v', 'q?', ['A. drops the drum', 'A. kicks the drum'])


def test_runner_keeps_the_users_letters(tmp_path):
    @register_method('_pick_kicks')
    def _pick_kicks(q, ctx): return {'answer': next(k for k, v in q.options.items() if 'kicks' in v)}
    q = Question('d', 'v', 'What happens first?', ['B. drops the drum', 'A. kicks the drum'], answer='A')
    run_eval([q], '_pick_kicks', tmp_path, backend='none', progress=False)
    (r,) = load_results(tmp_path)
    assert (r['answer'], r['gold'], r['correct']) == ('A', 'A', True)


def test_mmrv_letters_that_skip_one_and_duplicate_texts(tmp_path):
    letters = 'ABCDEFGHIK'                                        # as in MMR-V: no J
    rec = dict(video='Show.mp4', question='Which?', options=[f'({l}) thing {l}' for l in letters], correctAnswer='(K)')
    dup = dict(rec, options=['(A) same', '(B) other', '(C) same'], correctAnswer='(B)')
    _w(tmp_path / 'mmrv.json', json.dumps([rec, dup]))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        qs, rep = L.load_mmrv(tmp_path)
    assert list(qs[0].options) == list(letters) and qs[0].options['K'] == 'thing K' and qs[0].answer == 'K'
    assert not any(v.startswith('(') for v in qs[0].options.values())
    assert (rep.loaded, rep.skipped, len(rep.notes)) == (2, 0, 1) and 'options A, C have the same text' in rep.notes[0]
    assert any('repeat an option text' in str(x.message) for x in w)


# ---------------------------------------------------------------- one writer per RUN_DIR

HOLD = textwrap.dedent('''
    import sys, time
    from reveal_kit.eval.run_dir import locked_run_dir
    with locked_run_dir(sys.argv[1]):
        print('held', flush=True)
        time.sleep(60)
''')


def test_second_run_into_a_locked_run_dir_fails_at_once_naming_the_holder(tmp_path):
    script, out = _w(tmp_path / 'hold.py', HOLD), tmp_path / 'run'
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    p = subprocess.Popen([sys.executable, str(script), str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == 'held'
        qs = [Question('q0', 'v', 'question?', ['x', 'y'], answer='B')]
        with pytest.raises(RunLocked, match=rf'in use by another run \(pid {p.pid} on '):
            run_eval(qs, '_const_b', out, backend='none', progress=False)
        assert not (out / 'results.jsonl').exists()
    finally:
        p.kill()
        p.wait()
    assert run_eval(qs, '_const_b', out, backend='none', progress=False)['ran'] == 1      # a dead holder holds nothing


# ---------------------------------------------------------------- splits, roots, durations, layouts

def test_unknown_splits_name_the_valid_ones(tmp_path):
    vm, lvb = write_fixture('videomme', tmp_path / 'vm'), write_fixture('longvideobench', tmp_path / 'lvb')
    for bad in ('Long', 'test'):
        with pytest.raises(ValueError, match="valid splits: short, medium, long, all"):
            L.load_videomme(vm, split=bad)
    with pytest.raises(ValueError, match="no split 'dev'; valid splits: val, test"):
        L.load_longvideobench(lvb, split='dev')
    from reveal_kit.cli.main import app
    for name, root, split in (('videomme', vm, 'Long'), ('longvideobench', lvb, 'dev')):
        r = CliRunner().invoke(app, ['data', 'check', name, '--root', str(root), '--split', split])
        assert r.exit_code == 2 and 'valid splits' in r.output and 'Traceback' not in r.output, r.output


def test_data_check_is_never_ok_with_no_questions(tmp_path):
    root = write_fixture('synth', tmp_path / 'sy')
    (root / 'questions.jsonl').write_text('')
    (root / 'manifest.json').write_text(json.dumps({'n_questions': 0, 'n_videos': 0}))
    r = check_data('synth', root)
    assert r['loaded'] == 0 and r['status'] == 'no questions'


def test_root_may_be_the_annotation_file_itself(tmp_path):
    from reveal_kit.cli.main import app
    f = write_fixture('lvbench', tmp_path / 'lv') / 'video_info.meta.jsonl'
    r = check_data('lvbench', f)
    assert (r['loaded'], r['source'], r['annotations']) == (2, str(f), [dict(path=str(f), present=True)])
    out = CliRunner().invoke(app, ['data', 'check', 'lvbench', '--root', str(f)]).output
    assert 'MISSING' not in out and f'read: {f}' in out, out


def test_duration_group_has_one_meaning_and_seconds_are_probed(tmp_path):
    from reveal_kit.testing.videos import make_test_video
    lvb = L.load_longvideobench(write_fixture('longvideobench', tmp_path / 'lvb'))[0]
    assert {q.duration_group for q in lvb} == {'medium'}                     # '600' → 512.3 s → medium
    vm = write_fixture('videomme', tmp_path / 'vm')
    assert L.load_videomme(vm)[0][0].duration is None                        # an empty video file is not probed
    make_test_video(vm / 'data' / 'V1.mp4', scenes=((3, 1),))
    q = L.load_videomme(vm)[0][0]
    assert abs(q.duration - 3.0) < 0.2 and q.duration_group == 'long'        # Video-MME's own group is kept
    groups = {q.duration_group for name in ('lvbench', 'egoschema', 'egolifeqa')
              for q in L.load_benchmark(name, write_fixture(name, tmp_path / name))[0]}
    assert groups <= {'short', 'medium', 'long', 'hour+'}, groups


def test_egoschema_subset_as_csv_with_a0_to_a4(tmp_path):
    ans = {'u1': 3, 'u2': 0}
    rows = [dict(q_uid=u, question=f'What is C doing in {u}?', answer=ans.get(u, ''),
                 **{f'a{i}': f'activity {i} {u}' for i in range(5)}) for u in ('u1', 'u2', 'u3')]
    pd.DataFrame(rows).to_csv(tmp_path / 'egoschema_subset.csv', index=False)
    qs, rep = L.load_egoschema(tmp_path)
    assert [(q.qid, q.answer) for q in qs] == [('u1', 'D'), ('u2', 'A')] and rep.source.endswith('egoschema_subset.csv')
    assert qs[0].options == {L_: f'activity {i} u1' for i, L_ in enumerate('ABCDE')}
    assert len(L.load_egoschema(tmp_path, split='full')[0]) == 3
    r = check_data('egoschema', tmp_path / 'nothing')
    from reveal_kit.cli.present import format_check
    assert 'expected: annotation file(s) questions.json' in format_check(r) and 'a0' in format_check(r)


# ---------------------------------------------------------------- degraded results are counted, never hidden

def test_report_counts_degraded_results():
    rows = [dict(qid='1', answer='A', gold='A', correct=True),
            dict(qid='2', answer='B', gold='B', correct=True, degraded=True, failed_calls={'planner': 3, 'verifier': 1}),
            dict(qid='3', answer='A', gold='B', correct=False, degraded=False, failed_calls={})]
    rep = report(rows)
    assert (rep['n'], rep['correct'], rep['degraded'], rep['failed_calls']) == (3, 2, 1, {'planner': 3, 'verifier': 1})
    assert rep['accuracy_not_degraded'] == 0.5
    from reveal_kit.eval.metrics import format_report
    assert 'degraded 1 (answer not wholly from the configured model' in format_report(rep)


# ---------------------------------------------------------------- methods by name: plugins, +oracle

def test_pace_variants_are_in_the_registry_of_a_fresh_process_without_plugins():
    code = ("from reveal_kit.eval import methods\n"
            "assert methods.PLUGINS == [] and {'pace', 'dvd', 'pace-no-qcindex'} <= set(methods.METHODS)\n"
            "assert methods.get_method('pace_noindex') is methods.METHODS['pace-no-qcindex']\n"
            "assert callable(methods.get_method('pace')) and callable(methods.get_method('dvd'))\n"
            "known = methods.available_methods()\n"
            "assert {'pace-no-qcindex', 'pace-factors-3', 'reveal+oracle', '+iter+oracle'} <= set(known), known\n"
            "assert methods.load_plugins() == {}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    r = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_a_plugin_that_does_not_import_is_named_in_the_unknown_method_error(monkeypatch, tmp_path):
    from reveal_kit.eval import methods
    (tmp_path / '_plugin_ok.py').write_text("from reveal_kit.eval.methods import register_method\n"
                                            "register_method('_from_plugin')(lambda q, ctx: {'answer': 'B'})\n")
    (tmp_path / '_plugin_bad.py').write_text("raise ImportError('needs a package that is not installed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(methods, 'PLUGINS', ['_plugin_ok', '_plugin_bad'])
    monkeypatch.setattr(methods, '_PLUGINS_TRIED', set())
    monkeypatch.setattr(methods, '_PLUGIN_ERRORS', {})
    assert '_from_plugin' in methods.available_methods()
    qs = [Question('q0', 'v', 'question?', ['x', 'y'], answer='B')]
    assert run_eval(qs, '_from_plugin', tmp_path / 'run', backend='none', progress=False)['accuracy'] == 1.0
    with pytest.raises(KeyError, match=r"unknown method 'pace-x'.*_plugin_bad did not import "
                                       r"\(ImportError: needs a package that is not installed\)"):
        methods.get_method('pace-x')


def test_oracle_suffix_on_any_preset_is_a_method():
    from reveal_kit.eval.methods import get_method
    for name in ('reveal+oracle', 'base+oracle', '+onmem+oracle'):
        assert get_method(name).__qualname__ == '_preset_method.<locals>.run'
    with pytest.raises(KeyError, match='unknown method'):
        get_method('reveal+oracle+oracle')


# ---------------------------------------------------------------- the run's pool, roles, cache mode, timeout

def _alt_pool(path: Path, provenance: dict | None = None) -> Path:
    from reveal_kit.reveal.rubrics import default_pool_path
    from reveal_kit.testing.runs import renamed_pool
    return renamed_pool(default_pool_path(), path, provenance=provenance)


def test_the_configured_rubric_pool_scores_the_evidence(tmp_path, monkeypatch):
    from reveal_kit.eval.context import RunContext
    from reveal_kit.testing.fakes import synthetic_items, TinyMemory
    mem = TinyMemory(synthetic_items(60, {5: 'the man opens the red door', 30: 'the man opens the red door again',
                                          50: 'the man opens the red door for a delivery worker'}))
    monkeypatch.setattr(RunContext, 'memory', lambda self, q, chunking=None: mem)
    qs = [Question('c1', 'tiny', 'How many times does the man open the red door?', ['1', '2', '3', '4'], answer='C',
                   meta={'split': 'dev'})]
    pool = _alt_pool(tmp_path / 'induced.yaml', dict(benchmark='custom', split='dev'))
    with pytest.warns(UserWarning, match='not a held-out result'):
        s = run_eval(qs, 'reveal', tmp_path / 'alt', backend='none', overrides=[f'rubric_pool={pool}'], progress=False)
    assert s['failed'] == 0
    (r,) = load_results(tmp_path / 'alt')
    table = json.loads(Path(r['trace']).read_text())['rounds'][0]['verifier']['table']['A']
    assert table and all(k.startswith('alt_') for k in table), table
    meta = json.loads((tmp_path / 'alt' / 'run.json').read_text())
    assert meta['config']['rubric_pool'] == str(pool) and meta['rubric_pool'] == str(pool)
    assert 'not a held-out result' in meta['rubric_pool_warning'] and len(meta['rubric_pool_sha256']) == 64
    run_eval(qs, 'reveal', tmp_path / 'seed', backend='none', progress=False)
    (r,) = load_results(tmp_path / 'seed')
    table = json.loads(Path(r['trace']).read_text())['rounds'][0]['verifier']['table']['A']
    assert table and not any(k.startswith('alt_') for k in table), table
    assert json.loads((tmp_path / 'seed' / 'run.json').read_text())['rubric_pool_warning'] is None
    pool.write_text(pool.read_text().replace('weight: 1.5', 'weight: 1.25'))          # the pool file changed
    with pytest.raises(RunMismatch, match='rubric_pool_sha256'), pytest.warns(UserWarning):
        run_eval(qs, 'reveal', tmp_path / 'alt', backend='none', overrides=[f'rubric_pool={pool}'], progress=False)
    with pytest.raises(FileNotFoundError, match='rubric pool .* not found'):
        run_eval(qs, 'reveal', tmp_path / 'x', backend='none', overrides=[f'rubric_pool={tmp_path}/no.yaml'],
                 progress=False)


@register_method('_reads_model')
def _reads_model(q, ctx):
    return {'answer': 'A', 'timeout': ctx.model.timeout_s, 'cache': getattr(ctx.model, 'mode', None), 'roles': ctx.roles}


def test_cache_mode_timeout_and_roles_reach_the_model_and_run_json(tmp_path):
    qs = [Question('q0', 'v', 'question?', ['x', 'y'], answer='A')]
    srv = dict(backend='http', model='m', base_url='http://127.0.0.1:9', progress=False)
    run_eval(qs, '_reads_model', tmp_path / 'a', cache_mode='off', timeout_s=3, roles='offline', **srv)
    (r,) = load_results(tmp_path / 'a')
    assert (r['timeout'], r['cache'], r['roles']) == (3.0, None, 'offline')           # 'off': no cache wrapper
    meta = json.loads((tmp_path / 'a' / 'run.json').read_text())
    assert (meta['model'], meta['model_base_url'], meta['roles'], meta['cache_mode']) == \
           ('http:m', 'http://127.0.0.1:9/v1', 'offline', 'off')
    run_eval(qs, '_reads_model', tmp_path / 'b', cache_mode='replay', overrides=['timeout_s=4'], **srv)
    (r,) = load_results(tmp_path / 'b')
    assert (r['timeout'], r['cache'], r['roles']) == (4.0, 'replay', 'auto')
    assert run_eval(qs, '_reads_model', tmp_path / 'b', cache_mode='replay', **srv)['ran'] == 0    # timeout: same run
    with pytest.raises(RunMismatch, match='roles'):
        run_eval(qs, '_reads_model', tmp_path / 'b', cache_mode='replay', roles='model', **srv)
    for kw, msg in ((dict(cache_mode='fresh'), 'cache mode must be one of'), (dict(roles='all'), 'roles must be one of'),
                    (dict(timeout_s=-1), 'timeout must be > 0')):
        with pytest.raises(ValueError, match=msg):
            run_eval(qs, '_reads_model', tmp_path / 'c', **srv, **kw)
    assert not (tmp_path / 'c' / 'results.jsonl').exists()


def test_eval_cli_refuses_a_bad_cache_mode_and_roles_in_one_line(tmp_path):
    from reveal_kit.cli.main import app
    root = write_fixture('synth', tmp_path / 'data')
    base = ['eval', 'synth', '--method', '_const_b', '--root', str(root), '--backend', 'none', '--quiet']
    for extra, msg in ((['--cache', 'fresh'], 'cache mode must be one of'), (['--roles', 'model'], 'needs a chat model')):
        r = CliRunner().invoke(app, base + ['--out', str(tmp_path / 'x')] + extra)
        assert r.exit_code == 2 and msg in r.output and 'Traceback' not in r.output, r.output


def test_error_traces_of_ids_that_one_file_name_would_merge_stay_apart(tmp_path):
    @register_method('_boom')
    def _boom(q, ctx): raise RuntimeError(f'boom {q.qid}')
    qs = [Question(i, 'v', 'question?', ['x', 'y'], answer='A') for i in ('a/b', 'a_b')]
    run_eval(qs, '_boom', tmp_path, backend='none', progress=False)
    recs = {r['qid']: r for r in load_results(tmp_path)}
    assert recs['a/b']['trace'] != recs['a_b']['trace']
    for qid, r in recs.items():
        assert r['trace'].endswith('.error.txt') and f'boom {qid}' in Path(r['trace']).read_text()


# ---------------------------------------------------------------- PACE's diagnostics in the report

def test_report_averages_pace_diagnostics_and_leaves_other_rows_alone():
    from reveal_kit.eval.metrics import format_report
    def P(qid, nr, tools, ptc):
        return dict(qid=qid, answer='A', gold='A', correct=True, needle_recall=nr, steps=sum(tools.values()),
                    tool_calls=tools, invalid_calls=0, prompt_tokens=900, completion_tokens=100,
                    index=dict(n_clips=4, prompt_tokens_per_clip=ptc, completion_tokens_per_clip=20))
    rep = report([P('1', 1.0, {'ClipSearch': 3, 'Finish': 1}, 80), P('2', 0.0, {'Finish': 1}, 180),
                  P('3', None, {'GlobalBrowse': 1, 'Finish': 1}, 80)])
    assert (rep['needle_recall_mean'], rep['needle_recall_n']) == (0.5, 2)
    assert rep['tool_calls_mean'] == {'ClipSearch': 1.0, 'Finish': 1.0, 'GlobalBrowse': 1 / 3}
    assert rep['index_tokens_per_clip_mean'] == pytest.approx((100 + 200 + 100) / 3)
    assert rep['query_tokens_mean'] == 1000 and rep['steps_mean'] == pytest.approx(7 / 3)
    txt = format_report(rep)
    assert 'needle recall 50.0 % (2 questions with cues; judge lexical)' in txt and 'tool calls ClipSearch 1.00' in txt, txt
    assert 'tokens per clip (indexing) 133, per query (reasoning) 1000' in txt, txt
    plain = report([dict(qid='1', answer='A', gold='A', correct=True, rounds=2)])
    assert not {'needle_recall_mean', 'tool_calls_mean', 'index_tokens_per_clip_mean'} & set(plain)
    assert 'needle recall' not in format_report(plain) and 'per clip' not in format_report(plain)


# ---------------------------------------------------------------- which pool a run used (issue 21, item 1)

def test_a_real_benchmark_run_with_the_seed_pool_warns_once_and_records_the_pool(tmp_path, capsys):
    "One warning line for REVEAL on a real benchmark with the seed pool; run.json and the report name the pool."
    from reveal_kit.eval.metrics import report_run, format_report
    root = write_fixture('videomme', tmp_path / 'vm')
    for m in ('reveal', 'verify_only'):
        run_eval('videomme', m, tmp_path / m, root=root, split='long', backend='none', progress=False)
    err = [l for l in capsys.readouterr().err.splitlines() if 'rubric pool' in l]
    assert len(err) == 1 and 'seed' in err[0] and 'induced' in err[0], err
    meta = json.loads((tmp_path / 'reveal' / 'run.json').read_text())
    assert (meta['rubric_pool_kind'], meta['rubric_pool_used']) == ('seed', True)
    assert meta['rubric_pool_label'] == 'rubric pool seed (hand-written seed, not induced)'
    rep = report_run(tmp_path / 'reveal')
    assert rep['rubric_pool']['label'] == meta['rubric_pool_label']
    assert meta['rubric_pool_label'] in format_report(rep)
    run_eval('videomme', 'direct', tmp_path / 'direct', root=root, split='long', backend='none', progress=False)
    assert json.loads((tmp_path / 'direct' / 'run.json').read_text())['rubric_pool_used'] is False
    assert 'rubric pool' not in format_report(report_run(tmp_path / 'direct'))


def test_a_run_folder_written_under_an_earlier_method_spelling_resumes_and_compares(tmp_path):
    "A folder of `verify_only` (the spelling before `verify-only`) loads, resumes under either name, compares by name."
    from reveal_kit.eval.metrics import compare_runs, report_run
    root, old = write_fixture('videomme', tmp_path / 'vm'), tmp_path / 'old'
    run_eval('videomme', 'verify-only', old, root=root, split='long', limit=2, backend='none', progress=False)
    meta = json.loads((old / 'run.json').read_text())
    (old / 'run.json').write_text(json.dumps(dict(meta, method='verify_only')))           # as written before
    rows = [dict(json.loads(l), method='verify_only') for l in (old / 'results.jsonl').read_text().splitlines()]
    (old / 'results.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    for name in ('verify-only', 'verify_only'):
        s = run_eval('videomme', name, old, root=root, split='long', limit=2, backend='none', progress=False)
        assert (s['ran'], s['skipped_finished']) == (0, 2)
    assert report_run(old)['n'] == 2
    run_eval('videomme', 'rerank_only', tmp_path / 'new', root=root, split='long', limit=2, backend='none',
             progress=False)
    assert json.loads((tmp_path / 'new' / 'run.json').read_text())['method'] == 'rerank-only'
    assert compare_runs(old, tmp_path / 'new', n_boot=10)['methods'] == ['verify-only', 'rerank-only']


def test_an_induced_pool_is_named_with_its_provenance_and_not_warned_about(tmp_path, capsys):
    root = write_fixture('videomme', tmp_path / 'vm')
    pool = _alt_pool(tmp_path / 'induced-vm.yaml', dict(benchmark='videomme', split='medium', teacher='model',
                                                         proposer='model', iteration=2))
    pool.write_text(pool.read_text().replace('seed: true', 'seed: false'))
    run_eval('videomme', 'reveal', tmp_path / 'r', root=root, split='long', backend='none', progress=False,
             overrides=[f'rubric_pool={pool}'])
    assert 'rubric pool' not in capsys.readouterr().err
    meta = json.loads((tmp_path / 'r' / 'run.json').read_text())
    assert meta['rubric_pool_kind'] == 'induced' and meta['rubric_pool_provenance']['split'] == 'medium'
    assert 'induced on videomme/medium, teacher model, proposer model, iteration 2' in meta['rubric_pool_label']


# ---------------------------------------------------------------- PACE's per-role models and needle judge (issue 22)

def test_role_models_reach_pace_and_run_json_and_a_wrong_one_fails_in_one_line(tmp_path, monkeypatch):
    "`--role-model agent=URL,NAME,text`: PACE's agent steps go to that server, the rest to the run's model."
    from reveal_kit.cli.main import app
    from reveal_kit.testing.fakes import FakeChatServer
    root = tmp_path / 'b'
    from reveal_kit.synth.bench import generate_benchmark
    generate_benchmark(root, minutes=0.5, videos=1, questions_per_video=1, seed=2, split='test', progress=False)
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))
    with FakeChatServer(lambda p: json.dumps({'tool': 'Finish', 'arguments': {'answer': 'A'}}), model='agent-m') as srv:
        res = CliRunner().invoke(app, ['eval', 'run', 'synth', '--method', 'pace-no-verify', '--root', str(root),
                                       '--out', str(tmp_path / 'r'), '--backend', 'none', '--roles', 'auto',
                                       '--role-model', f'agent={srv.url},agent-m,text', '--cache', 'off', '--quiet'])
        roles = {json.dumps(p['messages'][0]['content'])[:40] for p in srv.requests}
    assert res.exit_code == 0, res.output
    meta = json.loads((tmp_path / 'r' / 'run.json').read_text())
    assert meta['role_models'] == {'agent': f'{srv.url},agent-m,text'}
    row = load_results(tmp_path / 'r')[0]
    assert row['models']['pace'] == dict(agent='http:agent-m', vision=None, vision_substitute=None)
    assert len(srv.requests) >= 2 and row['answer'] == 'A'           # the factors and the agent's step
    bad = CliRunner().invoke(app, ['eval', 'run', 'synth', '--method', 'pace', '--root', str(root), '--out',
                                   str(tmp_path / 'x'), '--backend', 'none', '--role-model', 'planner=http://h/v1'])
    assert bad.exit_code == 2 and 'GROUP one of agent, vision' in bad.output


def test_eval_report_judge_names_the_judge_of_each_number(tmp_path, monkeypatch):
    from reveal_kit.cli.main import app
    from reveal_kit.testing.fakes import FakeChatServer
    from reveal_kit.synth.bench import generate_benchmark
    root = tmp_path / 'b'
    generate_benchmark(root, minutes=0.5, videos=1, questions_per_video=2, seed=2, split='test', progress=False)
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))
    run_eval('synth', 'dvd', tmp_path / 'r', root=root, backend='none', progress=False)
    with FakeChatServer(lambda p: json.dumps({'found': False, 'why': 'not there'}), model='judge-m') as srv:
        out = CliRunner().invoke(app, ['eval', 'report', str(tmp_path / 'r'), '--judge', f'{srv.url},judge-m',
                                       '--cache', 'off']).output
    assert '; judge lexical)' in out and 'needle recall 0.0 % (1 questions with cues; judge model:judge-m)' in out, out
    assert (tmp_path / 'r' / 'needles' / 'model_judge-m.jsonl').exists()


def test_text_from_data_reaches_the_terminal_without_escape_sequences(tmp_path):
    "A question or option carrying OSC 52 (clipboard) or OSC 0 (title) is printed by `trace show` and `ask` stripped."
    from reveal_kit.cli.main import app
    root = write_fixture('synth', tmp_path / 'b')
    rows = [json.loads(l) for l in (root / 'questions.jsonl').read_text().splitlines()]
    osc52, osc0 = '\x1b]52;c;ZWNobyBwd25lZA==\x07', '\x1b]0;owned\x1b\\'
    rows[0]['question'] = f'How many red balls {osc52}appear?'
    rows[0]['options'] = {'A': f'one{osc0}', 'B': 'two\x1b[2J', 'C': 'three'}
    (root / 'questions.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    run = tmp_path / 'run'
    r = CliRunner().invoke(app, ['eval', 'run', 'synth', '--root', str(root), '--method', 'blind', '--out', str(run),
                                 '--quiet'])
    assert r.exit_code == 0, r.output
    res = [json.loads(l) for l in (run / 'results.jsonl').read_text().splitlines()]
    tp = Path(next(r['trace'] for r in res if r['qid'] == rows[0]['qid']))
    tp.write_text(json.dumps({**json.loads(tp.read_text()), 'question': rows[0]['question']}))   # as REVEAL's traces
    shown = CliRunner().invoke(app, ['trace', 'show', str(run), rows[0]['qid']])
    assert shown.exit_code == 0 and 'How many red balls appear?' in shown.output, shown.output
    assert '\x1b' not in shown.output and '\x07' not in shown.output
    vid = make_test_video(tmp_path / 'v.mp4', scenes=((3, 1), (3, 2)))
    asked = CliRunner().invoke(app, ['ask', str(vid), '-q', f'What is {osc52}shown?', '-o', f'a red{osc0}', '-o', 'blue',
                                     '--trace-dir', str(tmp_path / 'tr')])
    assert asked.exit_code == 0, asked.output
    assert 'a red' in asked.output and '\x1b' not in asked.output and '\x07' not in asked.output


def test_a_damaged_call_cache_is_recomputed_not_failed(tmp_path):
    "Call-cache rows with torn JSON are misses (recomputed, with a one-line warning); a garbage calls.sqlite is moved aside."
    import sqlite3
    from reveal_kit.testing.fakes import FakeChatServer
    from reveal_kit.synth.bench import generate_benchmark
    root = tmp_path / 'b'
    generate_benchmark(root, minutes=0.5, videos=1, questions_per_video=2, seed=2, split='test', progress=False)
    env = dict(os.environ, REVEAL_RUNS=str(tmp_path / 'runs'))
    cache = tmp_path / 'runs' / 'cache' / 'calls' / 'calls.sqlite'
    with FakeChatServer(lambda p: json.dumps({'answer': 'A'}), model='m') as srv:
        def run(out: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, '-c', 'from reveal_kit.cli.main import main; main()', 'eval', 'run',
                                   'synth', '--method', 'blind', '--root', str(root), '--out', str(tmp_path / out),
                                   '--backend', 'http', '--base-url', srv.url, '--model', 'm', '--quiet'],
                                  capture_output=True, text=True, env=env, timeout=300)
        first = run('r1')
        asked = len(srv.requests)
        assert first.returncode == 0 and asked >= 1, first.stderr
        with sqlite3.connect(cache) as con: con.execute("UPDATE calls SET entry = substr(entry, 1, 12)")
        torn = run('r2')
        assert torn.returncode == 0 and len(srv.requests) == 2 * asked, torn.stderr     # made again, not failed
        assert [(r['failed'], r['answer']) for r in load_results(tmp_path / 'r2')] == [(False, 'A')] * asked
        warned = [l for l in torn.stderr.splitlines() if 'damaged call-cache entry' in l]
        assert len(warned) == asked and warned[0].startswith('reveal: warning: '), torn.stderr
        cache.write_bytes(b'\x00garbage' * 512)
        garbage = run('r3')
        assert garbage.returncode == 0 and 'Traceback' not in garbage.stderr, garbage.stderr
        assert 'moved aside' in garbage.stderr and cache.with_name('calls.sqlite.damaged').exists()
        assert len(srv.requests) == 3 * asked


def test_ask_honours_the_configured_rubric_pool_and_a_missing_one_is_one_line(tmp_path, monkeypatch):
    """`reveal ask --set rubric_pool=PATH` answers with that pool (named in the trace); a missing PATH exits 2, one line,
    before any memory is built (a fresh runs folder: no memory to reuse)."""
    from reveal_kit.cli.main import app
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))
    vid = make_test_video(tmp_path / 'v.mp4', scenes=((3, 1), (3, 2)))
    ask = ['ask', str(vid), '-q', 'What colour is shown first?', '-o', 'A. red', '-o', 'B. blue', '--json',
           '--trace-dir', str(tmp_path / 'tr'), '--set']
    missing = CliRunner().invoke(app, ask + ['rubric_pool=/no/such/pool.yaml'])
    assert missing.exit_code == 2 and 'rubric pool not found: /no/such/pool.yaml' in missing.output, missing.output
    assert len(missing.output.strip().splitlines()) == 1
    own = CliRunner().invoke(app, ask + ['rubric_pool=rubrics/induced-synth.yaml'])
    assert own.exit_code == 0, own.output
    trace = json.loads(Path(json.loads(own.stdout)['trace']).read_text())    # stderr: the memory's build
    assert trace['rubric_pool']['name'] == 'induced-synth'
    paced = CliRunner().invoke(app, ['ask', str(vid), '-q', 'What colour?', '-o', 'A. red', '-o', 'B. blue',
                                     '--method', 'pace', '--cache', 'fresh', '--trace-dir', str(tmp_path / 'tr')])
    assert paced.exit_code == 2 and 'cache mode must be one of' in paced.output, paced.output   # --cache reaches PACE
