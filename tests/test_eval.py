"""Evaluation harness: official-format loaders, data check, resumable/sharded runner, metrics, `reveal eval` CLI."""
import json, os, signal, subprocess, sys, textwrap, time, warnings
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from reveal_kit.core import Question
from reveal_kit import benchmarks as B
from reveal_kit.runner import register_method, run_eval, eval_app, select_questions, shard_of, repair_results
from reveal_kit.metrics import load_results, report, compare, mcnemar_exact, paired_bootstrap_ci

ROOT = Path(__file__).resolve().parent.parent
PETS = {'A': 'a cat', 'B': 'a dog', 'C': 'two birds', 'D': 'a fish'}


# ---------------------------------------------------------------- loaders, one official-format fixture each

def _w(p: Path, text: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True); p.write_text(text); return p


def test_videomme_parquet_list_options(tmp_path):
    pd = pytest.importorskip('pandas')
    rows = [dict(video_id='001', duration='long', domain='Knowledge', sub_category='History', url='u', videoID='fFjv93ACGo8',
                 question_id='001-1', task_type='Counting Problem', question='Which pet is shown?',
                 options=['A. a cat', 'B. a dog', 'C. two birds', 'D. a fish'], answer='B'),
            dict(video_id='002', duration='short', domain='Knowledge', sub_category='History', url='u', videoID='x2',
                 question_id='002-1', task_type='OCR Problems', question='Text?', options=['A. 1', 'B. 2', 'C. 3', 'D. 4'], answer='A')]
    (tmp_path / 'videomme').mkdir()
    pd.DataFrame(rows).to_parquet(tmp_path / 'videomme' / 'test-00000-of-00001.parquet')
    qs, rep = B.load_videomme(tmp_path)                       # long split by default
    assert (rep.loaded, rep.skipped) == (1, 0)
    q = qs[0]
    assert (q.qid, q.video_id, q.options, q.answer, q.qtype, q.duration_group) == ('001-1', 'fFjv93ACGo8', PETS, 'B', 'Counting Problem', 'long')
    assert q.video_path == str(tmp_path / 'data' / 'fFjv93ACGo8.mp4') and q.subtitle_path.endswith('subtitle/fFjv93ACGo8.srt')
    assert len(B.load_videomme(tmp_path, split='all')[0]) == 2


def test_lvbench_jsonl_inline_options(tmp_path):
    rec = dict(key='aBcD', type='cartoon', video_info=dict(duration_minutes=65.0, fps=25.0),
               qa=[dict(uid='7', question='Which pet is shown?\n(A) a cat\n(B) a dog\n(C) two birds\n(D) a fish', answer='C',
                        question_type=['entity recognition', 'temporal grounding'], time_reference='01:05-01:12')])
    _w(tmp_path / 'video_info.meta.jsonl', json.dumps(rec) + '\n')
    qs, rep = B.load_lvbench(tmp_path)
    q = qs[0]
    assert (q.qid, q.video_id, q.question, q.options, q.answer) == ('7', 'aBcD', 'Which pet is shown?', PETS, 'C')
    assert (q.qtype, q.duration, q.duration_group, q.evidence_spans) == ('entity recognition', 3900.0, 'hour+', [(65.0, 72.0)])
    assert q.meta['question_types'] == ['entity recognition', 'temporal grounding']


def test_longvideobench_json_candidates_and_parquet_fields(tmp_path):
    rec = dict(video_id='v1', id='v1_0', video_path='v1.mp4', subtitle_path='v1_en.json', question='Which pet is shown?',
               candidates=list(PETS.values()), correct_choice=1, duration=420.0, duration_group=600, question_category='S2E',
               topic_category='KS', starting_timestamp_for_subtitles=3.0)
    _w(tmp_path / 'lvb_val.json', json.dumps([rec]))
    qs, _ = B.load_longvideobench(tmp_path)
    q = qs[0]
    assert (q.qid, q.options, q.answer, q.qtype, q.duration_group) == ('v1_0', PETS, 'B', 'S2E', '600')
    assert q.subtitle_path == str(tmp_path / 'subtitles' / 'v1_en.json')
    # the parquet release: option0..option4 as separate fields
    pd = pytest.importorskip('pandas')
    sep = {k: v for k, v in rec.items() if k != 'candidates'} | {f'option{i}': v for i, v in enumerate(PETS.values())}
    (tmp_path / 'pq').mkdir(); pd.DataFrame([sep]).to_parquet(tmp_path / 'pq' / 'validation-00000-of-00001.parquet')
    q2 = B.load_longvideobench(tmp_path / 'pq')[0][0]
    assert (q2.options, q2.answer) == (PETS, 'B')


def test_egoschema_separate_option_fields_and_subset(tmp_path):
    qs = [{'q_uid': u, 'google_drive_id': 'g', 'question': 'Which pet is shown?', **{f'option {i}': v for i, v in enumerate(PETS.values())}}
          for u in ('u1', 'u2')]
    _w(tmp_path / 'questions.json', json.dumps(qs)); _w(tmp_path / 'subset_answers.json', json.dumps({'u1': 3}))
    sub, rep = B.load_egoschema(tmp_path)
    assert [(q.qid, q.options, q.answer) for q in sub] == [('u1', PETS, 'D')]
    full, _ = B.load_egoschema(tmp_path, split='full')
    assert [q.answer for q in full] == ['D', None]


def test_mmrv_paren_options(tmp_path):
    rec = dict(video='Some Show.mp4', videoType='TV', question='Which pet is shown?', options=[f'({k}) {v}' for k, v in PETS.items()],
               correctAnswer='(A)', abilityType_L2='Counterintuitive Reasoning', abilityType_L3='x', question_idx=3)
    _w(tmp_path / 'mmrv.json', json.dumps([rec]))
    q = B.load_mmrv(tmp_path)[0][0]
    assert (q.options, q.answer, q.video_id, q.qtype) == (PETS, 'A', 'Some Show', 'Counterintuitive Reasoning')


def test_egolifeqa_choice_fields_and_times(tmp_path):
    rec = dict(ID='12', query_time=dict(date='DAY3', time='20000000'), type='EventRecall', need_audio=False, need_name=False,
               last_time=True, question='Which pet is shown?', choice_a='a cat', choice_b='a dog', choice_c='two birds', choice_d='a fish',
               answer='D', target_time=dict(date='DAY1', time='11152408'), keywords='hint')
    _w(tmp_path / 'EgoLifeQA' / 'EgoLifeQA_A1_JAKE.json', json.dumps([rec]))
    q = B.load_egolifeqa(tmp_path)[0][0]
    assert (q.qid, q.video_id, q.options, q.answer, q.qtype) == ('egolife_A1_JAKE_12', 'A1_JAKE', PETS, 'D', 'EventRecall')
    assert q.meta['query_seconds'] == 2 * 86400 + 20 * 3600
    assert q.evidence_spans == [(11 * 3600 + 15 * 60 + 24 + 0.4,) * 2] and 'keywords' not in q.meta


def test_synth_questions_jsonl(tmp_path):
    q = Question('s1', 'v0', 'Which pet is shown?', list(PETS.values()), answer='C', video_path='videos/v0.mp4', subtitle_path='videos/v0.srt')
    _w(tmp_path / 'questions.jsonl', json.dumps(q.to_dict()) + '\n')
    (got,), rep = B.load_synth(tmp_path)
    assert got.options == PETS and got.video_path == str(tmp_path / 'videos' / 'v0.mp4') and rep.loaded == 1


def test_the_three_option_shapes_give_the_same_question():
    recs = [{'question': 'Which pet is shown?', 'options': [f'{k}. {v}' for k, v in PETS.items()]},
            {'question': 'Which pet is shown?', 'option 0': 'a cat', 'option 1': 'a dog', 'option 2': 'two birds', 'option 3': 'a fish'},
            {'question': 'Which pet is shown? A. a cat B. a dog C. two birds D. a fish'}]
    assert {json.dumps(B.extract_options(r)) for r in recs} == {json.dumps(('Which pet is shown?', PETS))}


def test_truncated_file_names_file_and_record(tmp_path):
    recs = [dict(id=f'v_{i}', video_id='v', video_path='v.mp4', question='q?', candidates=['a', 'b'], correct_choice=0) for i in range(4)]
    text = json.dumps(recs)
    p = _w(tmp_path / 'lvb_val.json', text[:int(len(text) * 0.6)])
    with pytest.raises(B.AnnotationError, match=r'lvb_val\.json: malformed JSON at record 2'):
        B.load_longvideobench(tmp_path)
    _w(tmp_path / 'video_info.meta.jsonl', '{"key": "a", "qa": []}\n{"key": "b", "qa": [')
    with pytest.raises(B.AnnotationError, match=r'video_info\.meta\.jsonl: malformed JSON on line 2'):
        B.load_lvbench(tmp_path)


def test_bad_records_are_counted_not_dropped(tmp_path):
    good = dict(id='ok', video_id='v', video_path='v.mp4', question='q?', candidates=['a', 'b'], correct_choice=1)
    bad = [dict(good, id='bad-gold', correct_choice=5), {k: v for k, v in good.items() if k != 'candidates'} | {'id': 'no-options'},
           dict(good, id='ok'), {k: v for k, v in good.items() if k != 'id'}]
    _w(tmp_path / 'lvb_val.json', json.dumps([good] + bad))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        qs, rep = B.load_longvideobench(tmp_path)
    assert (rep.loaded, rep.skipped, len(rep.reasons)) == (1, 4, 4)
    assert 'record 1 (bad-gold)' in rep.reasons[0] and 'out of range' in rep.reasons[0]
    assert 'duplicate qid' in rep.reasons[2] and "missing field 'id'" in rep.reasons[3]
    assert any('skipped 4' in str(x.message) for x in w)


# ---------------------------------------------------------------- data check

def test_data_check_on_a_partial_root(tmp_path):
    root = B.write_fixture('lvbench', tmp_path / 'lv')            # 2 questions, 1 video present
    (root / 'videos' / 'vidA.mp4').unlink()
    r = B.check_data('lvbench', root)
    assert (r['loaded'], r['expected_questions'], r['videos'], r['videos_present'], r['videos_missing']) == (2, 1549, 1, 0, 1)
    assert r['status'] == 'incomplete' and r['annotations'][0]['present']
    r = B.check_data('egoschema', tmp_path / 'nothing')
    assert r['status'] == 'missing annotations' and 'no annotation file' in r['error']
    res = CliRunner().invoke(B.data_app, ['check', 'videomme', '--root', str(B.write_fixture('videomme', tmp_path / 'vm')), '--json'])
    out = json.loads(res.output)
    assert res.exit_code == 1 and (out['loaded'], out['videos_present'], out['subtitles_present']) == (2, 1, 1)


# ---------------------------------------------------------------- runner: resume after a kill, shards

SCRIPT = textwrap.dedent('''
    import sys, time
    from reveal_kit.core import Question
    from reveal_kit.runner import register_method, run_eval

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
    p.send_signal(signal.SIGKILL); p.wait()
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
    assert all(shard_of(q.video_id, 4) == shard_of(q.video_id, 4) for q in qs)
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


# ---------------------------------------------------------------- the CLI: bare, run, report, compare (and mounted)

def test_eval_cli_three_forms(tmp_path):
    root = B.write_fixture('synth', tmp_path / 'data')
    cli = CliRunner()
    base = ['--root', str(root), '--backend', 'none', '--quiet']
    r = cli.invoke(eval_app, ['synth', '--method', '_const_b', '--out', str(tmp_path / 'a')] + base)
    assert r.exit_code == 0, r.output
    r = cli.invoke(eval_app, ['run', 'synth', '--method', '_const_b', '--out', str(tmp_path / 'a'), '--limit', '2'] + base)
    assert r.exit_code == 0 and '0 run, 2 already done' in r.output, r.output        # rerun resumes (limit is not part of the identity)
    r = cli.invoke(eval_app, ['run', 'synth', '-m', 'blind', '-o', str(tmp_path / 'b')] + base)
    assert r.exit_code == 0, r.output
    r = cli.invoke(eval_app, ['report', str(tmp_path / 'a'), '--json'])
    rep = json.loads(r.output)
    assert r.exit_code == 0 and rep['n'] == 4 and rep['accuracy'] == 1.0
    assert 'accuracy 100.0 %' in cli.invoke(eval_app, ['report', str(tmp_path / 'a')]).output
    r = cli.invoke(eval_app, ['compare', str(tmp_path / 'a'), str(tmp_path / 'b'), '--json'])
    c = json.loads(r.output)
    assert r.exit_code == 0 and c['n_common'] == 4 and 'mcnemar_p' in c
    assert 'McNemar exact p' in cli.invoke(eval_app, ['compare', str(tmp_path / 'a'), str(tmp_path / 'b')]).output
    parent = typer.Typer(); parent.add_typer(eval_app, name='eval')                     # as `reveal eval …`
    r = cli.invoke(parent, ['eval', 'synth', '--method', '_const_b', '--out', str(tmp_path / 'c')] + base)
    assert r.exit_code == 0 and '4 run' in r.output, r.output
    assert cli.invoke(parent, ['eval', 'report', str(tmp_path / 'c')]).exit_code == 0


def test_rerun_with_other_config_is_refused(tmp_path):
    qs = [Question('q0', 'v', 'question?', ['x', 'y'], answer='B')]
    run_eval(qs, '_const_b', tmp_path, backend='none', progress=False)
    with pytest.raises(Exception, match='other settings'):
        run_eval(qs, '_const_b', tmp_path, backend='none', progress=False, overrides=['tau=0.5'])


# ---------------------------------------------------------------- end to end: generated benchmark, offline roles

@pytest.mark.slow
def test_end_to_end_generated_benchmark_offline_roles(tmp_path, monkeypatch):
    synth = pytest.importorskip('reveal_kit.synth')
    pytest.importorskip('reveal_kit.agent'); pytest.importorskip('reveal_kit.offline_memory')
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))                     # memories and caches stay in tmp
    root = tmp_path / 'data'
    synth.generate_benchmark(root, minutes=1, videos=1, questions_per_video=3, seed=0, progress=False)
    qs, rep = B.load_synth(root)
    assert rep.skipped == 0 and len(qs) >= 2
    chk = B.check_data('synth', root)
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
    assert all(r['evidence'] for r in results['direct'].values())
    c = compare(results['reveal'].values(), results['base'].values(), n_boot=500)
    assert c['n_common'] == len(qs) and 0 <= c['mcnemar_p'] <= 1
    assert run_eval('synth', 'reveal', tmp_path / 'reveal', root=root, backend='embedded', progress=False)['ran'] == 0


def test_only_present_videos(tmp_path):
    root = B.write_fixture('synth', tmp_path / 'data')                           # only videos/v0.mp4 exists
    s = run_eval('synth', '_const_b', tmp_path / 'run', root=root, backend='none', only_present=True, progress=False)
    assert s['selected'] == 2 and {r['video_id'] for r in load_results(tmp_path / 'run')} == {'v0'}
    with pytest.raises(ValueError, match='takes no'):
        run_eval('lvbench', '_const_b', tmp_path / 'x', root=root, split='val', backend='none', progress=False)
