"""PACE: factors without options, the evidence index, the five tools + Finish, the loop, DVD, needle recall, resume."""
import json
from pathlib import Path

import numpy as np
import pytest

import reveal_kit.pace.index as pace_index
from reveal_kit.core import Config, Question
from reveal_kit.backends.chat import ScriptedModel
from reveal_kit.backends.messages import message_text
from reveal_kit.testing.fakes import HashEmbedder, FakeChatServer
from reveal_kit.backends.http import OpenAIHTTPModel
from reveal_kit.pace.factors import Factor, extract_factors, offline_factors
from reveal_kit.pace.index import (ClipRecord, EvidenceDB, tag_factors, factor_text, get_pace_dbs, build_plain_db,
                                   load_db)
from reveal_kit.pace.tools import ToolBox, PACE_TOOLS, DVD_TOOLS, inspect_times
from reveal_kit.pace.agent import (run_agent, OfflinePolicy, ModelPolicy, answer_pace, needle_recall, cue_recovered,
                                   PACE_SPECS)
from reveal_kit.eval.methods import get_method, shared_plain_db
from reveal_kit.eval.runner import run_eval
from reveal_kit.eval.context import RunContext
from reveal_kit.synth.bench import generate_benchmark, load_questions

HE = HashEmbedder()
TEXTS = ['On-screen text: "GIRL KICKS LAMP".', 'On-screen text: "PILOT SELLS LAMP".', 'Scene colours: red; static.',
         'On-screen text: "GIRL OPENS BOX".', 'On-screen text: "CHEF PAINTS CUP".', 'Scene colours: blue; static.']
Q = Question('q1', 'v', 'What does the girl do with the lamp?',
             ['the girl sells the lamp', 'the girl kicks the lamp', 'the girl paints the lamp'], answer='B',
             evidence_spans=[(0, 10)], cues=['girl kicks lamp'])


def toy_db(factors=(), texts=TEXTS):
    recs = [ClipRecord(f"C{i:04d}", 10 * i, 10 * i + 10, factor_text(t, factors, tag_factors(factors, t)),
                       tag_factors(factors, t)) for i, t in enumerate(texts)]
    return EvidenceDB.from_records(recs, HE, list(factors))


@pytest.fixture(scope='module')
def bench(tmp_path_factory):
    "A generated benchmark of one 1-minute video (on-screen text, subtitles, annotated cues)."
    root = tmp_path_factory.mktemp('pace_bench') / 'data'
    generate_benchmark(root, minutes=1, videos=1, questions_per_video=6, seed=3, split='test', progress=False)
    return root, load_questions(root)


@pytest.fixture
def hash_embedder(monkeypatch):
    monkeypatch.setattr(pace_index, 'get_text_embedder', lambda name='auto': HE)
    return HE


# ---------------------------------------------------------------- stage 1
def test_factor_prompt_never_sees_options():
    seen = []
    def fn(messages, schema, role):
        seen.append('\n'.join(message_text(m) for m in messages))
        return {'factors': [{'text': 'the girl with the lamp', 'kind': 'entity'}]}
    q = Question('q', 'v', 'What does the girl do with the lamp?', ['juggles zebras', 'polishes trumpets'])
    fs, src, calls = extract_factors(q.question, ScriptedModel(fn))
    assert src == 'model' and len(calls) == 1 and len(seen) == 1
    for word in ('juggles', 'zebras', 'polishes', 'trumpets'):
        assert word not in seen[0]
    with pytest.raises(TypeError):
        extract_factors(q)


@pytest.mark.parametrize('question', ['How many times does the chef open the box in the video?',
                                      'What happens right after the pilot kicks the ball?',
                                      'Which of these is NOT shown in the video?',
                                      'Why does the red robot lift the drum?'])
def test_factor_budget_bounds_and_forced(question):
    fs, _, _ = extract_factors(question)
    assert 1 <= len(fs) <= 3
    for k in range(1, 6):
        fs, src, _ = extract_factors(question, force=k)
        assert len(fs) == k and src == 'offline'
        assert len({f.text for f in fs}) == k
    cfg = Config(pace_min_factors=2, pace_max_factors=2)
    assert len(extract_factors(question, config=cfg)[0]) == 2


def test_model_factors_out_of_budget_fall_back():
    m = ScriptedModel(lambda ms, s, r: {'factors': [{'text': 'a', 'kind': 'entity'}] * 4})
    fs, src, calls = extract_factors('Who opens the box?', m, force=2)
    assert src == 'fallback' and len(fs) == 2 and calls and not calls[0]['ok']


def test_index_build_reuse_and_resume(bench, hash_embedder, tmp_path):
    root, qs = bench
    q = qs[0]
    plain, fdb = get_pace_dbs(q.video_path, offline_factors(q.question), subtitles=q.subtitle_path, root=tmp_path)
    assert [(r.t_start, r.t_end) for r in plain.records] == [(10.0 * i, 10.0 * i + 10) for i in range(6)]
    assert fdb.path.parent == plain.path.parent and fdb.kind == 'factor'
    assert all(set(r.tags) == {f.fid for f in fdb.factors} for r in fdb.records)
    assert sum(bool(r.meta.get('ocr')) for r in plain.records) >= 2
    # reuse: same files, nothing rebuilt
    again = get_pace_dbs(q.video_path, subtitles=q.subtitle_path, root=tmp_path)[0]
    assert again.manifest['created'] == plain.manifest['created']
    # resume: manifest gone, last clip torn → only the torn clip is captioned again
    (plain.path / 'manifest.json').unlink()
    lines = (plain.path / 'clips.jsonl').read_text().splitlines()
    (plain.path / 'clips.jsonl').write_text('\n'.join(lines[:5]) + '\n' + lines[5][:30])
    n = []
    real = pace_index.plain_caption
    pace_index.plain_caption = lambda *a, **k: (n.append(1), real(*a, **k))[1]
    try:
        resumed = build_plain_db(q.video_path, plain.path, subtitles=q.subtitle_path, text_embedder=HE)
    finally:
        pace_index.plain_caption = real
    assert len(n) == 1 and [r.text for r in resumed.records] == [r.text for r in plain.records]
    assert load_db(plain.path, HE).manifest['n_clips'] == 6


# ---------------------------------------------------------------- tools
def test_query_decompose_at_most_once():
    tb = ToolBox(Q, toy_db())
    assert tb.call('QueryDecompose').ok
    second = tb.call('QueryDecompose')
    assert not second.ok and 'already called' in second.error
    assert len(tb.factors) == 3


def test_evidence_retrieve_by_tag_and_by_text():
    fq = [Factor('f1', 'lamp', 'entity')]
    texts = ['On-screen text: "GIRL KICKS".', 'Scene colours: grey.', 'On-screen text: "LAMP".',
             'On-screen text: "GIRL PAINTS".']
    tb = ToolBox(Q, toy_db(fq, texts), retrieve_topk=2)
    by_tag = tb.call('EvidenceRetrieve', {'factor': 'lamp'})
    assert by_tag.data['tags_used'] == ['f1']
    assert max(by_tag.records, key=lambda d: d['score'])['item_id'] == 'C0002'
    tb.call('QueryDecompose')
    by_text = tb.call('EvidenceRetrieve', {'factor': 'd2'})         # 'kick': no factor tag carries it
    assert by_text.data['tags_used'] == []
    assert max(by_text.records, key=lambda d: d['score'])['item_id'] == 'C0000'
    assert tb.factors[1].addressed and tb.factors[1].by == 'retrieved'


def test_frame_inspect_range_errors_and_frame_cap(bench, hash_embedder, tmp_path):
    root, qs = bench
    plain = get_pace_dbs(qs[0].video_path, root=tmp_path)[0]
    tb = ToolBox(qs[0], plain, Config(frameinspect_max_frames=5))
    past = tb.call('FrameInspect', {'question': 'what is shown?', 'time_ranges': [[700, 710]]})
    assert not past.ok and "past the video's end" in past.error
    assert not tb.call('FrameInspect', {'question': 'x', 'time_ranges': [[8, 3]]}).ok
    assert not tb.call('FrameInspect', {'question': 'x', 'time_ranges': [[1, 2, 3]]}).ok
    ok = tb.call('FrameInspect', {'question': 'what is shown?', 'time_ranges': [[0, 10], [20, 30]]})
    assert ok.ok and ok.data['n_frames'] == 5 and len(ok.records) == 2
    assert all(len(inspect_times([(0, 600)] * 8, k, 2.0)) <= k for k in (1, 7, 50))


def test_frame_inspect_reads_a_range_once_offline_and_always_for_a_vlm(bench, hash_embedder, tmp_path, monkeypatch):
    import reveal_kit.pace.tools as pace_tools
    root, qs = bench
    plain = get_pace_dbs(qs[0].video_path, root=tmp_path)[0]
    decoded, real = [], pace_tools.read_frames_at
    monkeypatch.setattr(pace_tools, 'read_frames_at', lambda p, ts, w=None: decoded.append(len(ts)) or real(p, ts, w))
    args = {'question': 'what is shown?', 'time_ranges': [[0, 10], [20, 30]]}
    first = ToolBox(qs[0], plain).call('FrameInspect', args)
    again = ToolBox(qs[1], plain).call('FrameInspect', args)        # another question's fresh toolbox
    counts = lambda o: (o.data['n_frames'], o.data['readings_reused'])
    assert decoded == [40] and counts(first) == (40, 0)
    assert again.summary == first.summary and counts(again) == (40, 2)
    memo = Path(plain.path).parent / 'inspect_readings.jsonl'
    assert len(memo.read_text().splitlines()) == 2
    part = ToolBox(qs[0], plain).call('FrameInspect', {'question': 'x', 'time_ranges': [[0, 10], [40, 50]]})
    assert decoded == [40, 40] and part.data['readings_reused'] == 1
    assert part.records[0]['text'] == first.records[0]['text'] != part.records[1]['text']
    seen = []
    vlm = ScriptedModel(lambda ms, s, r: seen.append(r) or {'answer': 'a red lamp'})
    looked = ToolBox(qs[0], plain, model=vlm).call('FrameInspect', args)
    assert decoded == [40, 40, 40] and seen == ['pace_inspect'] and 'a red lamp' in looked.summary


# ---------------------------------------------------------------- loop
def test_loop_stops_at_budget():
    m = ScriptedModel(lambda ms, s, r: {'tool': 'ClipSearch', 'arguments': {'description': 'girl'}})
    for n in (2, 5):
        tr = run_agent(ToolBox(Q, toy_db()), ModelPolicy(m), max_steps=n)
        assert len(tr['steps']) == n and tr['steps'][-1]['tool'] == 'Finish'
        assert tr['stop_reason'] == 'budget' and tr['answer'] in Q.options


def test_loop_stops_when_all_factors_addressed():
    def fn(messages, schema, role):
        if role == 'pace_decompose':
            return {'factors': [{'criterion': 'girl kicks lamp', 'rules_in': ['B'], 'rules_out': ['A']}]}
        last = message_text(messages[-1])
        if 'must now call Finish' in last: return {'tool': 'Finish', 'arguments': {'answer': 'B'}}
        if 'Contrastive factors' not in last: return {'tool': 'QueryDecompose', 'arguments': {}}
        return {'tool': 'EvidenceRetrieve', 'arguments': {'factor': 'd1'}}
    m = ScriptedModel(fn)
    tr = run_agent(ToolBox(Q, toy_db(), model=m), ModelPolicy(m), max_steps=15)
    assert [s['tool'] for s in tr['steps']] == ['QueryDecompose', 'EvidenceRetrieve', 'Finish']
    assert tr['stop_reason'] == 'all_factors_addressed' and tr['answer'] == 'B'
    off = run_agent(ToolBox(Q, toy_db()), OfflinePolicy(), max_steps=15)
    assert off['stop_reason'] == 'all_factors_addressed' and len(off['steps']) == 6


def test_invalid_tool_calls_are_reported_and_counted():
    "A model that ignores the call schema: the same bad reply to a step and to the chat layer's repair request."
    bad = ['{"tool": "ClipSearch", "arguments": ', {'tool': 'Teleport', 'arguments': {}},
           {'tool': 'FrameInspect', 'arguments': {'question': 'x'}},
           {'tool': 'EvidenceRetrieve', 'arguments': {'factor': 'd9'}}]              # valid JSON call, a tool error
    def fn(messages, schema, role):
        n = message_text(messages[1]).count('\n\nStep ')
        return bad[n] if n < len(bad) else {'tool': 'Finish', 'arguments': {'answer': 'Q'}}
    m = ScriptedModel(fn)
    m.max_failures_in_row = None         # the chat layer's circuit breaker (5 failed calls in a row) is not tested here
    res = answer_pace(Q, toy_db(), 'pace', m, return_trace=True)
    tr = res['trace_data']
    kinds = [(s['tool'], s['invalid'], s['ok']) for s in tr['steps']]
    assert kinds[:4] == [('None', True, False), ('Teleport', True, False), ('FrameInspect', True, False),
                         ('EvidenceRetrieve', False, False)]
    assert tr['invalid_calls'] == 3 and tr['tool_errors'] == len(tr['steps']) - 3 and len(tr['steps']) == 15
    prompts = [message_text(c['messages'][1]) for c in m.calls]
    assert any("unknown tool 'Teleport'" in p for p in prompts)
    assert any("'time_ranges' is a required property" in p for p in prompts)
    assert res['answer'] in Q.options and tr['notes'] and res['degraded']
    assert res['failed_calls']['pace_agent'] == len(tr['steps']) - 1


def test_schema_following_model_makes_only_valid_calls():
    """A model that emits the smallest value valid under the schema it is sent (as a base model decoding under a
    grammar emits some valid value) calls only allowed tools with valid arguments and finishes with a letter."""
    for spec, allowed in (('pace', PACE_TOOLS), ('dvd', DVD_TOOLS)):
        m = ScriptedModel()                                          # replies minimal_instance(schema)
        tb = ToolBox(Q, toy_db(), model=m, tools=PACE_SPECS[spec].tools)
        tr = run_agent(tb, ModelPolicy(m), max_steps=4)
        assert tr['invalid_calls'] == 0 and tr['tool_errors'] == 0 and all(s['ok'] for s in tr['steps'])
        assert {s['tool'] for s in tr['steps']} <= set(allowed) and tr['steps'][-1]['tool'] == 'Finish'
        assert tr['answer'] in Q.options and not tr['notes']


def test_tool_calls_through_an_openai_compatible_server():
    "The model policy's calls are JSON-schema structured output over HTTP; the trace names every tool called."
    def handler(payload):
        last = payload['messages'][-1]['content']
        last = last if isinstance(last, str) else ' '.join(p.get('text', '') for p in last)
        if 'must now call Finish' in last or 'Step 1:' in last:
            return json.dumps({'tool': 'Finish', 'arguments': {'answer': 'B'}})
        return json.dumps({'tool': 'ClipSearch', 'arguments': {'description': 'girl kicks lamp'}})
    with FakeChatServer(handler) as srv:
        m = OpenAIHTTPModel(srv.url, retries=0)
        tr = run_agent(ToolBox(Q, toy_db(), model=m), ModelPolicy(m), max_steps=6)
        assert all('response_format' in p for p in srv.requests)
        run_agent(ToolBox(Q, toy_db(), model=m), ModelPolicy(m), max_steps=1)      # one step: a forced Finish
        sent = [p['response_format']['json_schema']['schema'] for p in srv.requests]
        names = [[b['properties']['tool']['enum'][0] for b in s['anyOf']] for s in sent]
    assert names == [list(PACE_TOOLS), list(PACE_TOOLS), ['Finish']]      # each step offers exactly the allowed calls
    assert sent[-1]['anyOf'][0]['properties']['arguments']['properties']['answer']['enum'] == list(Q.options)
    assert [s['tool'] for s in tr['steps']] == ['ClipSearch', 'Finish'] and tr['answer'] == 'B'
    assert tr['steps'][0]['prompt_tokens'] > 0


def test_plain_index_under_offline_roles_calls_no_model(bench, hash_embedder, tmp_path, monkeypatch):
    "`--roles offline` with a meaningful model: the shared plain index is the perceptual one and the model is idle."
    root, qs = bench
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path))
    for roles, captioner in (('offline', 'offline-perceptual'), ('auto', 'model:scripted')):
        m = ScriptedModel(lambda ms, s, r: {'description': 'a scripted caption'})
        ctx = RunContext('synth', 'pace', tmp_path / roles, backend='scripted', model_obj=m, roles=roles)
        db = shared_plain_db(qs[0], ctx)
        assert db.manifest['models']['captioner'] == captioner
        assert (len(m.calls) == 0) == (roles == 'offline')


def test_dvd_uses_no_pace_tools():
    assert set(PACE_SPECS['dvd'].tools) == set(DVD_TOOLS)
    res = answer_pace(Q, toy_db(), 'dvd', return_trace=True)
    called = {s['tool'] for s in res['trace_data']['steps']}
    assert not called & {'QueryDecompose', 'EvidenceRetrieve'} and 'ClipSearch' in called
    tb = ToolBox(Q, toy_db(), tools=DVD_TOOLS)
    assert tb.call('QueryDecompose').data.get('invalid')
    assert tb.call('EvidenceRetrieve', {'factor': 'x'}).data['invalid']


# ---------------------------------------------------------------- needle recall
def test_needle_recall_arithmetic():
    q = Question('q', 'v', 'How many?', ['1', '2'], evidence_spans=[(0, 5), (30, 35), (60, 65)],
                 cues=['chef opens box', 'chef opens box', 'girl lifts drum because the bell rang'])
    rows = [dict(t_start=0, t_end=10, text='"CHEF OPENS BOX"'),
            dict(t_start=10, t_end=20, text='"CHEF OPENS BOX"'),
            dict(t_start=60, t_end=70, text='"GIRL LIFTS DRUM" "BECAUSE THE BELL"')]
    assert needle_recall(q, rows) == pytest.approx(2 / 3)     # cue 2: right text at the wrong time; cue 3: 5/6 stems
    assert cue_recovered(q.cues[2], q.evidence_spans[2], rows)
    assert needle_recall(q, rows[:1]) == pytest.approx(1 / 3)
    assert needle_recall(q, rows, min_cover=0.9) == pytest.approx(1 / 3)
    assert needle_recall(q, []) == 0.0
    assert needle_recall(Question('q', 'v', 'x?', ['a', 'b']), rows) is None


# ---------------------------------------------------------------- runner
def test_methods_registered_and_resume_after_kill(bench, hash_embedder, tmp_path):
    root, qs = bench
    for name in ('pace', 'pace-no-qcindex', 'pace-no-verify', 'dvd', 'pace-factors-1', 'pace-factors-5',
                 'pace_noindex', 'pace_nodecompose'):
        assert callable(get_method(name))
    out = tmp_path / 'run'
    s1 = run_eval('synth', 'pace', out, root=root, limit=2, progress=False)
    assert s1['ran'] == 2 and s1['failed'] == 0
    rows = [json.loads(l) for l in (out / 'results.jsonl').read_text().splitlines()]
    assert all(r['answer'] in next(q for q in qs if q.qid == r['qid']).options for r in rows)
    assert all(r['needle_recall'] is not None and r['steps'] >= 2 and r['llm_calls'] == 0 for r in rows)
    with open(out / 'results.jsonl', 'a') as f:
        f.write('{"qid": "torn')                                              # killed while writing
    s2 = run_eval('synth', 'pace', out, root=root, progress=False)
    assert s2['skipped_finished'] == 2 and s2['ran'] == len(qs) - 2 and s2['repaired_lines'] == 1
    tr = json.loads(Path(rows[0]['trace']).read_text())
    assert {'steps', 'question_factors', 'contrastive_factors', 'evidence', 'stop_reason'} <= set(tr)
    assert all({'tool', 'arguments', 'summary', 'prompt_tokens', 'completion_tokens', 'latency_s', 'data'} <= set(s)
               for s in tr['steps'])
