"""PACE and DVD: factors without options, the evidence index, the tools, the loop and who ends it, each method's prompt,
DVD's function calling, per-role models, the needle judges, the index cost, thinking replies, resume."""
import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import reveal_kit.pace.index as pace_index
from reveal_kit.core import Config, Question
from reveal_kit.backends.chat import ScriptedModel
from reveal_kit.backends.messages import message_text
from reveal_kit.testing.fakes import HashEmbedder, FakeChatServer
from reveal_kit.testing.videos import make_test_video
from reveal_kit.backends.http import OpenAIHTTPModel
from reveal_kit.pace.factors import Factor, extract_factors, offline_factors
from reveal_kit.pace.roles import PaceModels, VisionRefused
from reveal_kit.pace.index import (ClipRecord, EvidenceDB, tag_factors, factor_text, get_pace_dbs, build_plain_db,
                                   load_db)
from reveal_kit.pace.tools import ToolBox, PACE_TOOLS, DVD_TOOLS
from reveal_kit.pace.inspect import inspect_times
from reveal_kit.pace.loop import run_agent
from reveal_kit.pace.dvd import ToolCallPolicy, dvd_messages
from reveal_kit.pace.needle import needle_recall, cue_recovered, judge_run, judge_rows
from reveal_kit.pace.agent import answer_pace, PACE_SPECS
from reveal_kit.pace.policies import OfflinePolicy, ModelPolicy
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
DECOMPOSE = {'factors': [{'criterion': 'girl kicks lamp', 'rules_in': ['B'], 'rules_out': ['A']}]}
SUBJECT = dict(name='a girl', appearance=['red coat'], identity=['the lamp owner'], first_seen='00:00:01')


def toy_db(factors=(), texts=TEXTS):
    recs = [ClipRecord(f"C{i:04d}", 10 * i, 10 * i + 10, factor_text(t, factors, tag_factors(factors, t)),
                       tag_factors(factors, t)) for i, t in enumerate(texts)]
    return EvidenceDB.from_records(recs, HE, list(factors))


class Capped(ScriptedModel):
    "A scripted model that also records every call's max_tokens and the size of every image it is sent."
    def _complete(self, messages, *, schema, max_tokens, temperature, role):
        self.calls.append({'role': role, 'max_tokens': max_tokens, 'images': image_sizes(messages)})
        return super()._complete(messages, schema=schema, max_tokens=max_tokens, temperature=temperature, role=role)


def image_sizes(messages) -> list[tuple[int, int]]:
    "(width, height) of every image part of the messages."
    parts = [p for m in messages if isinstance(m.get('content'), list) for p in m['content']]
    urls = [p['image_url']['url'] for p in parts if p.get('type') == 'image_url']
    return [Image.open(io.BytesIO(base64.b64decode(u.split(',', 1)[1]))).size for u in urls]


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
    again = get_pace_dbs(q.video_path, subtitles=q.subtitle_path, root=tmp_path)[0]
    assert again.manifest['created'] == plain.manifest['created']
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


# ---------------------------------------------------------------- tools (item 10: DVD's arguments and outputs)
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
    by_text = tb.call('EvidenceRetrieve', {'factor': 'd2'})
    assert by_text.data['tags_used'] == []
    assert max(by_text.records, key=lambda d: d['score'])['item_id'] == 'C0000'
    assert tb.factors[1].addressed and tb.factors[1].by == 'retrieved'


def test_clip_search_returns_every_caption_whole_with_its_time_range():
    "DVD's clip_search_tool: the full captions of the top 16, each prefixed with its time range (no word cut)."
    long = [f"On-screen text: \"GIRL {i}\". " + ' '.join(f'w{i}x{j}' for j in range(80)) for i in range(20)]
    o = ToolBox(Q, toy_db(texts=long)).call('ClipSearch', {'event_description': 'girl'})
    lines = o.summary.splitlines()[1:]
    assert len(lines) == 16 and all(l.startswith('[00:') for l in lines)
    assert all(len(l.split()) == 1 + 4 + 80 for l in lines)               # label + 'On-screen text: "GIRL i".' + 80


def test_frame_inspect_hhmmss_ranges_errors_and_frame_cap(bench, hash_embedder, tmp_path):
    root, qs = bench
    plain = get_pace_dbs(qs[0].video_path, root=tmp_path)[0]
    tb = ToolBox(qs[0], plain, Config(frameinspect_max_frames=5))
    call = lambda *r: tb.call('FrameInspect', {'question': 'what is shown?', 'time_ranges_hhmmss': list(r)})
    past = call(['00:11:40', '00:11:50'])
    assert not past.ok and "past the video's end" in past.error
    assert not call(['00:00:08', '00:00:03']).ok
    assert call([8, 13]).data.get('invalid')                              # seconds: not DVD's HH:MM:SS
    ok = call(['00:00:00', '00:00:10'], ['00:00:20', '00:00:30'])
    assert ok.ok and ok.data['n_frames'] == 5 and len(ok.records) == 2
    assert all(len(inspect_times([(0, 600)] * 8, k, 2.0)) <= k for k in (1, 7, 50))


def test_frame_inspect_says_so_when_nothing_answers(bench, hash_embedder, tmp_path):
    root, qs = bench
    plain = get_pace_dbs(qs[0].video_path, root=tmp_path)[0]
    vlm = ScriptedModel(lambda ms, s, r: {'found': False, 'answer': 'an empty room'})
    o = ToolBox(qs[0], plain, model=vlm).call('FrameInspect', {'question': 'is there a dog?',
                                                                'time_ranges_hhmmss': [['00:00:00', '00:00:10']]})
    assert o.summary.startswith('Nothing in the given time range(s) answers the question.')


def test_frame_inspect_reads_a_range_once_offline_and_always_for_a_vlm(bench, hash_embedder, tmp_path, monkeypatch):
    import reveal_kit.pace.tools as pace_tools
    root, qs = bench
    plain = get_pace_dbs(qs[0].video_path, root=tmp_path)[0]
    decoded, real = [], pace_tools.read_frames_at
    monkeypatch.setattr(pace_tools, 'read_frames_at', lambda p, ts, w=None: decoded.append(len(ts)) or real(p, ts, w))
    args = {'question': 'what is shown?', 'time_ranges_hhmmss': [['00:00:00', '00:00:10'], ['00:00:20', '00:00:30']]}
    first = ToolBox(qs[0], plain).call('FrameInspect', args)
    again = ToolBox(qs[1], plain).call('FrameInspect', args)
    counts = lambda o: (o.data['n_frames'], o.data['readings_reused'])
    assert decoded == [40] and counts(first) == (40, 0)
    assert again.summary == first.summary and counts(again) == (40, 2)
    memo = Path(plain.path).parent / 'inspect_readings.jsonl'
    assert len(memo.read_text().splitlines()) == 2
    seen = []
    vlm = ScriptedModel(lambda ms, s, r: seen.append(r) or {'found': True, 'answer': 'a red lamp'})
    looked = ToolBox(qs[0], plain, model=vlm).call('FrameInspect', args)
    assert decoded == [40, 40] and seen == ['pace_inspect'] and 'a red lamp' in looked.summary


def test_global_browse_returns_the_registry_and_the_query_events_as_json(bench, hash_embedder, tmp_path):
    "DVD's global_browse_tool: the video's subject registry (merged by the VLM from the clips) and the events."
    root, qs = bench
    def vlm(messages, schema, role):
        if role == 'pace_caption': return {'subjects': [SUBJECT], 'description': 'A girl in a red coat.'}
        if role == 'pace_registry': return {'subjects': [SUBJECT]}
        return {'answer': 'The girl kicks the lamp at 00:00:05.'}
    m = ScriptedModel(vlm)
    plain = get_pace_dbs(qs[0].video_path, (), Config(), m, root=tmp_path)[0]
    assert plain.manifest['subject_registry'] == [SUBJECT] and plain.records[0].meta['subjects'] == [SUBJECT]
    o = ToolBox(qs[0], plain, model=m).call('GlobalBrowse', {'query': 'what does the girl do with the lamp?'})
    got = json.loads(o.summary)
    assert got == {'subject_registry': [SUBJECT], 'query_related_event': 'The girl kicks the lamp at 00:00:05.'}
    user = message_text(m.calls[-1]['messages'][1])
    assert 'Query: what does the girl do with the lamp?' in user and user.count('[00:00:') >= 6


def test_dvd_uses_no_pace_tools():
    assert set(PACE_SPECS['dvd'].tools) == set(DVD_TOOLS)
    res = answer_pace(Q, toy_db(), 'dvd', return_trace=True)
    called = {s['tool'] for s in res['trace_data']['steps']}
    assert not called & {'QueryDecompose', 'EvidenceRetrieve'} and 'ClipSearch' in called
    tb = ToolBox(Q, toy_db(), tools=DVD_TOOLS)
    assert tb.call('QueryDecompose').data.get('invalid')
    assert tb.call('EvidenceRetrieve', {'factor': 'x'}).data['invalid']


# ---------------------------------------------------------------- the loop (items 1, 2, 3)
def test_the_model_not_the_code_ends_the_episode():
    "A model that asks for FrameInspect after EvidenceRetrieve addressed every factor gets FrameInspect."
    def fn(messages, schema, role):
        if role == 'pace_decompose': return DECOMPOSE
        last = message_text(messages[-1])
        if 'Call: FrameInspect' in last: return {'tool': 'Finish', 'arguments': {'answer': 'B'}}
        if 'Call: EvidenceRetrieve' in last:
            return {'tool': 'FrameInspect', 'arguments': {'question': 'does she kick it?',
                                                          'time_ranges_hhmmss': [['00:00:00', '00:00:10']]}}
        if 'Contrastive factors' not in last: return {'tool': 'QueryDecompose', 'arguments': {}}
        return {'tool': 'EvidenceRetrieve', 'arguments': {'factor': 'd1'}}
    m = ScriptedModel(fn)
    tb = ToolBox(Q, toy_db(), model=m)
    tr = run_agent(tb, ModelPolicy(m), max_steps=15)
    assert tb.factors[0].addressed
    assert [s['tool'] for s in tr['steps']] == ['QueryDecompose', 'EvidenceRetrieve', 'FrameInspect', 'Finish']
    assert tr['stop_reason'] == 'finish' and tr['answer'] == 'B'
    off = run_agent(ToolBox(Q, toy_db()), OfflinePolicy(), max_steps=15)
    assert off['stop_reason'] == 'offline:all_factors_addressed' and len(off['steps']) == 6


def test_loop_stops_at_budget():
    m = ScriptedModel(lambda ms, s, r: {'tool': 'ClipSearch', 'arguments': {'event_description': 'girl'}})
    m.max_failures_in_row = None
    for n in (2, 5):
        tr = run_agent(ToolBox(Q, toy_db()), ModelPolicy(m), max_steps=n)
        assert len(tr['steps']) == n and tr['steps'][-1]['tool'] == 'Finish'
        assert tr['stop_reason'] == 'budget' and tr['answer'] in Q.options


def test_the_agent_sees_whole_results_its_thoughts_and_the_video_length():
    "ClipSearch's 16 records all reach the next prompt, with the agent's own thought and the video's duration."
    texts = [f'On-screen text: "GIRL {i} KICKS LAMP". ' + 'filler ' * 40 for i in range(30)]
    prompts = []
    def fn(messages, schema, role):
        prompts.append(message_text(messages[1]))
        if len(prompts) == 1:
            return {'thought': 'search the kicks', 'tool': 'ClipSearch', 'arguments': {'event_description': 'girl'}}
        return {'tool': 'Finish', 'arguments': {'answer': 'B'}}
    m = ScriptedModel(fn)
    tr = run_agent(ToolBox(Q, toy_db(texts=texts)), ModelPolicy(m), max_steps=15)
    second = prompts[1]
    assert sum(f'"GIRL {i} KICKS LAMP"' in second for i in range(30)) == 16
    assert 'Thought: search the kicks' in second
    assert 'The video is 300 seconds long (00:05:00)' in prompts[0]
    assert len(tr['steps'][0]['summary']) > 2000                        # the trace keeps the whole result too


@pytest.mark.parametrize('method', ['pace-no-verify', 'dvd'])
def test_each_method_is_told_only_about_its_own_tools(method):
    sent = []
    def fn(messages, schema, role):
        if role == 'pace_agent': sent.append(' '.join(message_text(m) for m in messages[:2]))
        return {'tool_calls': [{'name': 'Finish', 'arguments': {'answer': 'B'}}]} if role == 'pace_agent' and \
            'tool_calls' in json.dumps(schema) else {'tool': 'Finish', 'arguments': {'answer': 'B'}}
    answer_pace(Q, toy_db(), method, ScriptedModel(fn))
    assert sent and not [w for w in ('QueryDecompose', 'EvidenceRetrieve', 'contrastive') if w in sent[0]]
    assert 'FrameInspect' in sent[0]


def test_invalid_tool_calls_are_reported_and_counted():
    bad = ['{"tool": "ClipSearch", "arguments": ', {'tool': 'Teleport', 'arguments': {}},
           {'tool': 'FrameInspect', 'arguments': {'question': 'x'}},
           {'tool': 'EvidenceRetrieve', 'arguments': {'factor': 'd9'}}]
    def fn(messages, schema, role):
        n = message_text(messages[1]).count('\nCall: ')
        return bad[n] if n < len(bad) else {'tool': 'Finish', 'arguments': {'answer': 'Q'}}
    m = ScriptedModel(fn)
    m.max_failures_in_row = None
    res = answer_pace(Q, toy_db(), 'pace', m, return_trace=True)
    tr = res['trace_data']
    kinds = [(s['tool'], s['invalid'], s['ok']) for s in tr['steps']]
    assert kinds[:4] == [('None', True, False), ('Teleport', True, False), ('FrameInspect', True, False),
                         ('EvidenceRetrieve', False, False)]
    assert tr['invalid_calls'] == 3 and tr['tool_errors'] == len(tr['steps']) - 3 and len(tr['steps']) == 15
    prompts = [message_text(c['messages'][1]) for c in m.calls]
    assert any("unknown tool 'Teleport'" in p for p in prompts)
    assert any("'time_ranges_hhmmss' is a required property" in p for p in prompts)
    assert res['answer'] in Q.options and tr['notes'] and res['degraded']


def test_schema_following_model_makes_only_valid_calls():
    "A model emitting the smallest value valid under the schema it is sent calls only allowed tools, validly."
    for spec, allowed in (('pace', PACE_TOOLS), ('dvd', DVD_TOOLS)):
        m = ScriptedModel()
        res = answer_pace(Q, toy_db(), spec, m, config=Config(pace_max_steps=4), return_trace=True)
        tr = res['trace_data']
        assert tr['invalid_calls'] == 0 and all(s['ok'] or s['tool'] == 'FrameInspect' for s in tr['steps'])
        assert {s['tool'] for s in tr['steps']} <= set(allowed)
        if spec == 'pace': assert tr['steps'][-1]['tool'] == 'Finish' and res['answer'] in Q.options
        else: assert res['answer'] is None and tr['substitutions'] == []   # DVD's last turn: any tool, no stand-in


def test_structured_tool_steps_through_an_openai_compatible_server():
    "The JSON protocol over HTTP: each step's schema offers exactly the allowed calls; the trace names every tool."
    def handler(payload):
        last = payload['messages'][-1]['content']
        last = last if isinstance(last, str) else ' '.join(p.get('text', '') for p in last)
        if 'last turn' in last or 'Step 1.' in last:
            return json.dumps({'tool': 'Finish', 'arguments': {'answer': 'B'}})
        return json.dumps({'tool': 'ClipSearch', 'arguments': {'event_description': 'girl kicks lamp'}})
    with FakeChatServer(handler) as srv:
        m = OpenAIHTTPModel(srv.url, retries=0)
        tr = run_agent(ToolBox(Q, toy_db(), model=m), ModelPolicy(m), max_steps=6)
        run_agent(ToolBox(Q, toy_db(), model=m), ModelPolicy(m), max_steps=1)
        sent = [p['response_format']['json_schema']['schema'] for p in srv.requests]
        names = [[b['properties']['tool']['enum'][0] for b in s['anyOf']] for s in sent]
    assert names == [list(PACE_TOOLS), list(PACE_TOOLS), ['Finish']]
    assert sent[-1]['anyOf'][0]['properties']['arguments']['properties']['answer']['enum'] == list(Q.options)
    assert [s['tool'] for s in tr['steps']] == ['ClipSearch', 'Finish'] and tr['answer'] == 'B'


# ---------------------------------------------------------------- DVD's protocol (item 9)
def test_dvd_runs_by_function_calling_over_one_conversation_with_several_calls_a_turn():
    def fn(messages, schema, role):
        n = sum(m['role'] == 'assistant' for m in messages)
        return {'tool_calls': [[{'name': 'GlobalBrowse', 'arguments': {'query': 'girl and lamp'}},
                                {'name': 'ClipSearch', 'arguments': {'event_description': 'girl kicks lamp'}}],
                               [{'name': 'Finish', 'arguments': {'answer': 'B'}}]][min(n, 1)]}
    m = ScriptedModel(fn)
    res = answer_pace(Q, toy_db(), 'dvd', PaceModels(m, None), return_trace=True)
    tr = res['trace_data']
    assert [(s['turn'], s['tool']) for s in tr['steps']] == [(0, 'GlobalBrowse'), (0, 'ClipSearch'), (1, 'Finish')]
    assert tr['protocol'] == 'tools' and res['rounds'] == 2 and res['steps'] == 3
    agent = [c for c in m.calls if c['role'] == 'pace_agent']
    assert [x['role'] for x in agent[1]['messages']] == ['system', 'user', 'assistant', 'tool', 'tool']
    assert 'The video is 60 seconds long' in message_text(agent[0]['messages'][1])


def test_pace_may_use_function_calling_and_the_trace_says_which():
    def fn(messages, schema, role):
        if role == 'pace_decompose': return DECOMPOSE
        n = sum(m['role'] == 'assistant' for m in messages)
        return {'tool_calls': [[{'name': 'QueryDecompose', 'arguments': {}}],
                               [{'name': 'Finish', 'arguments': {'answer': 'B'}}]][min(n, 1)]}
    from reveal_kit.pace.policies import make_policy
    from reveal_kit.pace.roles import PaceSettings
    m = ScriptedModel(fn)
    tb = ToolBox(Q, toy_db(), model=m)
    pol = make_policy(PACE_SPECS['pace'], tb, [], m, PaceSettings(protocol='tools'))
    tr = run_agent(tb, pol)
    assert pol.protocol == 'tools' and [s['tool'] for s in tr['steps']] == ['QueryDecompose', 'Finish']
    assert 'criterion' not in pol.messages[1]['content'] and 'girl kicks lamp' in pol.messages[3]['content']


def test_dvd_function_calling_through_an_openai_compatible_server():
    "Native `tools` + `tool_choice='required'` over HTTP, `tool` replies sent back, the calls parsed into steps."
    def handler(payload):
        n = sum(m['role'] == 'assistant' for m in payload['messages'])
        calls = [[{'name': 'ClipSearch', 'arguments': {'event_description': 'girl kicks lamp'}}],
                 [{'name': 'Finish', 'arguments': {'answer': 'B'}}]][min(n, 1)]
        return {'content': 'I will search.', 'tool_calls': calls, 'reasoning': 'the lamp is kicked in clip 1'}
    with FakeChatServer(handler) as srv:
        m = OpenAIHTTPModel(srv.url, retries=0)
        res = answer_pace(Q, toy_db(), 'dvd', PaceModels(m, None), return_trace=True)
    assert all(p['tool_choice'] == 'required' and p['tools'] for p in srv.requests)
    assert [t['function']['name'] for t in srv.requests[0]['tools']] == list(DVD_TOOLS)
    assert srv.requests[1]['messages'][-1]['role'] == 'tool' and 'GIRL KICKS LAMP' in \
        srv.requests[1]['messages'][-1]['content']
    steps = res['trace_data']['steps']
    assert [s['tool'] for s in steps] == ['ClipSearch', 'Finish'] and res['answer'] == 'B'
    assert steps[0]['reasoning'] == 'the lamp is kicked in clip 1' and res['reasoning_tokens'] > 0


# ---------------------------------------------------------------- thinking backbones (item 8)
def test_a_thinking_server_reply_is_parsed_and_its_reasoning_counted():
    "A reply with separate `reasoning` and a `<think>` block holding braces: the call parses, reasoning is counted."
    def handler(payload):
        if 'last turn' in json.dumps(payload['messages']) or 'Step 1.' in json.dumps(payload['messages']):
            call = {'tool': 'Finish', 'arguments': {'answer': 'B'}}
        else: call = {'tool': 'ClipSearch', 'arguments': {'event_description': 'girl'}}
        return {'content': '<think>maybe {"tool": "Teleport"} first?</think>' + json.dumps(call),
                'reasoning': 'options differ by the verb', 'usage': {'completion_tokens_details':
                                                                     {'reasoning_tokens': 17}}}
    with FakeChatServer(handler) as srv:
        m = OpenAIHTTPModel(srv.url, retries=0)
        res = answer_pace(Q, toy_db(), 'pace-no-verify', m, return_trace=True)
    steps = res['trace_data']['steps']
    assert [s['tool'] for s in steps] == ['ClipSearch', 'Finish'] and res['invalid_calls'] == 0
    assert 'options differ by the verb' in steps[0]['reasoning'] and res['reasoning_tokens'] == 34


# ---------------------------------------------------------------- per-role models (item 7)
def test_composite_backbone_sends_each_role_to_its_model(bench, hash_embedder, tmp_path):
    root, qs = bench
    agent = ScriptedModel(lambda ms, s, r: DECOMPOSE if r == 'pace_decompose' else
                          {'factors': [{'text': 'the girl', 'kind': 'entity'}]} if r == 'pace_factors' else
                          {'tool': 'Finish', 'arguments': {'answer': 'A'}}, model_id='qwen3-8b', supports_images=False)
    vision = ScriptedModel(model_id='qwen2.5-vl-7b')
    plain = get_pace_dbs(qs[0].video_path, (), Config(), vision, root=tmp_path)[0]
    res = answer_pace(qs[0], plain, 'pace', PaceModels(agent, vision))
    assert {c['role'] for c in agent.calls} == {'pace_factors', 'pace_agent'}
    assert {c['role'] for c in vision.calls} == {'pace_caption', 'pace_index'}      # no subjects: nothing to merge
    assert res['models']['pace'] == dict(agent='scripted:qwen3-8b', vision='scripted:qwen2.5-vl-7b',
                                         vision_substitute=None)


def test_a_model_without_image_input_is_refused_for_vision_roles_or_named(bench, hash_embedder, tmp_path):
    root, qs = bench
    text_only = ScriptedModel(lambda ms, s, r: {'tool_calls': [{'name': 'Finish', 'arguments': {'answer': 'A'}}]},
                              supports_images=False)
    with pytest.raises(VisionRefused, match='no image input'):
        answer_pace(qs[0], toy_db(), 'pace', text_only)
    plain = get_pace_dbs(qs[0].video_path, root=tmp_path)[0]
    cfg = Config().replace(pace_vision_substitute='ocr')
    res = answer_pace(qs[0], plain, 'dvd', text_only, cfg, return_trace=True)
    assert res['models']['pace']['vision_substitute'] == 'ocr-facts'


def test_frames_go_to_the_vision_model_at_720p_and_the_caps_are_settings(tmp_path, hash_embedder):
    vid = make_test_video(tmp_path / 'hd.mp4', [(4, 1, 'GIRL KICKS LAMP')], fps=2, size=(1920, 1080))
    m = Capped(lambda ms, s, r: {'subjects': [], 'description': 'a girl'} if r == 'pace_caption' else
               {'subjects': []})
    get_pace_dbs(vid, (), Config(), m, root=tmp_path / 'a')
    cap = next(c for c in m.calls if c['role'] == 'pace_caption')
    assert cap['images'] and set(cap['images']) == {(1280, 720)} and cap['max_tokens'] == 600
    big = Config().replace(pace_caption_max_tokens=4096, pace_frame_height=360)
    m2 = Capped(m.fn)
    get_pace_dbs(vid, (), big, m2, root=tmp_path / 'b')
    cap = next(c for c in m2.calls if c['role'] == 'pace_caption')
    assert set(cap['images']) == {(640, 360)} and cap['max_tokens'] == 4096


# ---------------------------------------------------------------- Table 6: every indexing call (item 5)
def test_index_cost_counts_captions_registry_records_and_factors(bench, hash_embedder, tmp_path):
    root, qs = bench
    def vlm(ms, s, role):
        if role == 'pace_caption': return {'subjects': [SUBJECT], 'description': 'A girl.'}
        if role == 'pace_registry': return {'subjects': [SUBJECT]}
        if role == 'pace_factors': return {'factors': [{'text': 'the girl', 'kind': 'entity'}]}
        if role == 'pace_index': return {'description': 'A girl.', 'factors': [dict(id='f1', observed=True, how='x')]}
        return {'tool': 'Finish', 'arguments': {'answer': 'A'}}
    m = ScriptedModel(vlm)
    plain = get_pace_dbs(qs[0].video_path, (), Config(), m, root=tmp_path)[0]
    res = answer_pace(qs[0], plain, 'pace', m)
    assert res['index']['calls'] == 6 + 1 + 6 + 1                           # captions, registry, records, F_Q
    assert res['index']['prompt_tokens'] > plain.manifest['index_calls']['prompt_tokens'] > 0


# ---------------------------------------------------------------- needle recall (item 4)
def test_needle_recall_arithmetic():
    q = Question('q', 'v', 'How many?', ['1', '2'], evidence_spans=[(0, 5), (30, 35), (60, 65)],
                 cues=['chef opens box', 'chef opens box', 'girl lifts drum because the bell rang'])
    rows = [dict(t_start=0, t_end=10, text='"CHEF OPENS BOX"'),
            dict(t_start=10, t_end=20, text='"CHEF OPENS BOX"'),
            dict(t_start=60, t_end=70, text='"GIRL LIFTS DRUM" "BECAUSE THE BELL"')]
    assert needle_recall(q, rows) == pytest.approx(2 / 3)
    assert cue_recovered(q.cues[2], q.evidence_spans[2], rows)
    assert needle_recall(q, rows[:1]) == pytest.approx(1 / 3)
    assert needle_recall(q, rows, min_cover=0.9) == pytest.approx(1 / 3)
    assert needle_recall(q, rows, spans=False) == pytest.approx(1.0)
    assert needle_recall(q, []) == 0.0
    assert needle_recall(Question('q', 'v', 'x?', ['a', 'b']), rows) is None


def test_global_browse_output_counts_for_needle_recall():
    db = toy_db(texts=['On-screen text: "GIRL KICKS LAMP".'] + ['Scene colours: red.'] * 5)
    q = Question('q', 'v', 'What does the girl do?', ['kicks the lamp', 'sells the lamp'], evidence_spans=[(0, 10)],
                 cues=['girl kicks lamp'])
    res = answer_pace(q, db, 'pace-without-clipsearch', config=Config(pace_max_steps=2))
    assert [e['source'] for e in res['evidence']] == ['GlobalBrowse'] and res['needle_recall'] == 1.0


def test_the_model_judge_is_cached_traced_and_named(tmp_path):
    from reveal_kit.backends.cache import CachedModel, CallCache
    rows = [dict(t_start=0, t_end=10, text='a girl kicks a lamp', source='ClipSearch')]
    (tmp_path / 'results.jsonl').write_text(json.dumps(dict(qid='q1', evidence=rows, failed=False)) + '\n')
    inner = ScriptedModel(lambda ms, s, r: {'found': 'kicks a lamp' in message_text(ms[1]), 'why': 'clip 1'},
                          model_id='gpt-judge')
    judge = CachedModel(inner, CallCache(tmp_path / 'calls.sqlite'))
    got = judge_run(tmp_path, [Q], judge)
    assert got['q1']['needle_recall'] == 1.0 and got['q1']['needle_judge'] == 'model:gpt-judge'
    assert got['q1']['calls'][0]['role'] == 'needle_judge'
    (tmp_path / 'needles' / 'model_gpt-judge.jsonl').unlink()
    n = len(inner.calls)
    assert judge_run(tmp_path, [Q], judge)['q1']['calls'][0]['cache_hit'] and len(inner.calls) == n
    assert judge_rows(dict(answer_source='model', reasoning='she kicks it', evidence=rows))[0]['text'] == \
        'she kicks it'


# ---------------------------------------------------------------- runner
def test_plain_index_under_offline_roles_calls_no_model(bench, hash_embedder, tmp_path, monkeypatch):
    root, qs = bench
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path))
    for roles, captioner in (('offline', 'offline-perceptual'), ('auto', 'model:scripted')):
        m = ScriptedModel(lambda ms, s, r: {'subjects': [], 'description': 'a scripted caption'})
        ctx = RunContext('synth', 'pace', tmp_path / roles, backend='scripted', model_obj=m, roles=roles)
        db = shared_plain_db(qs[0], ctx)
        assert db.manifest['models']['captioner'] == captioner
        assert (len(m.calls) == 0) == (roles == 'offline')


def test_methods_registered_and_resume_after_kill(bench, hash_embedder, tmp_path):
    root, qs = bench
    for name in ('pace', 'pace-no-qcindex', 'pace-no-verify', 'dvd', 'pace-factors-1', 'pace-factors-5',
                 'pace_noindex', 'pace_nodecompose', 'pace-without-evidenceretrieve', 'pace-without-clipsearch'):
        assert callable(get_method(name))
    out = tmp_path / 'run'
    s1 = run_eval('synth', 'pace', out, root=root, limit=2, progress=False)
    assert s1['ran'] == 2 and s1['failed'] == 0
    rows = [json.loads(l) for l in (out / 'results.jsonl').read_text().splitlines()]
    assert all(r['answer'] in next(q for q in qs if q.qid == r['qid']).options for r in rows)
    assert all(r['needle_recall'] is not None and r['steps'] >= 2 and r['llm_calls'] == 0 for r in rows)
    with open(out / 'results.jsonl', 'a') as f:
        f.write('{"qid": "torn')
    s2 = run_eval('synth', 'pace', out, root=root, progress=False)
    assert s2['skipped_finished'] == 2 and s2['ran'] == len(qs) - 2 and s2['repaired_lines'] == 1
    tr = json.loads(Path(rows[0]['trace']).read_text())
    assert {'steps', 'question_factors', 'contrastive_factors', 'evidence', 'stop_reason', 'protocol'} <= set(tr)
    assert all({'tool', 'arguments', 'summary', 'prompt_tokens', 'completion_tokens', 'latency_s', 'data', 'turn',
                'thought'} <= set(s) for s in tr['steps'])


# ---------------------------------------------------------------- DVD over real OpenAI-compatible servers (item 9)
def _dvd_over(m) -> tuple[dict, list]:
    "DVD's function-calling loop over a real server's model (a base model: its calls are junk, the protocol is not)."
    res = answer_pace(Q, toy_db(), 'dvd', PaceModels(m, None), config=Config(pace_max_steps=3), return_trace=True)
    return res, res['trace_data']['steps']


@pytest.fixture(scope='module')
def llama_server(tmp_path_factory):
    "A real llama-cpp-python OpenAI-compatible server (the packaged Gemma-3-270M) on a free loopback port."
    import socket, subprocess, sys, time
    import httpx
    from reveal_kit.backends.llamacpp import packaged_gguf_path, default_llama_threads
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    logf = tmp_path_factory.mktemp('llama') / 'server.log'
    cmd = [sys.executable, '-m', 'llama_cpp.server', '--model', str(packaged_gguf_path()), '--host', '127.0.0.1',
           '--port', str(port), '--n_ctx', '4096', '--n_threads', str(default_llama_threads()), '--chat_format', 'gemma']
    with open(logf, 'wb') as out: proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url, t0 = f'http://127.0.0.1:{port}/v1', time.time()
    try:
        while True:
            if proc.poll() is not None: pytest.fail(f"llama_cpp.server exited:\n{logf.read_text()[-2000:]}")
            try:
                if httpx.get(f'{url}/models', timeout=2).status_code == 200: break
            except httpx.TransportError: pass
            if time.time() - t0 > 120: pytest.fail(f"llama_cpp.server not ready:\n{logf.read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.server
def test_dvd_function_calling_against_a_real_llama_cpp_server(llama_server):
    """The calls as JSON under the tools' schema (llama.cpp's grammar): DVD's tools only, a bad argument kept with its
    error (a grammar does not bound numbers), the conversation growing turn by turn with the `tool` replies."""
    m = OpenAIHTTPModel(llama_server, model='gemma', tool_mode='schema', timeout=300, retries=1)
    res, steps = _dvd_over(m)
    assert res['trace_data']['protocol'] == res['protocol'] == 'tools_as_json'
    assert {s['tool'] for s in steps} <= set(DVD_TOOLS)         # DVD's last turn keeps every tool on offer:
    assert res['answer'] in Q.options if steps[-1]['tool'] == 'Finish' else res['answer'] is None    # no stand-in
    assert all(s['error'] for s in steps if s['invalid']) and len(steps) == 3 and res['rounds'] <= 3
    first = [s['prompt_tokens'] for s in steps if s['calls']]
    assert first == sorted(first) and first[0] < first[-1]        # each turn sends the earlier turns and results




# ---------------------------------------------------------------- budgets that hold, protocols recorded (issue 34)
def _flood_server(name: str, args):
    "An agent that answers every turn with 50 calls of `name` (Finish when only Finish is offered); roles: minimal JSON."
    from reveal_kit.backends.replies import minimal_instance
    def handler(payload):
        if 'tools' not in payload:
            return json.dumps(minimal_instance(payload['response_format']['json_schema']['schema']))
        if len(payload['tools']) == 1 or 'last turn' in str(payload['messages'][-1].get('content')):   # DVD: all on offer
            return {'tool_calls': [{'name': 'Finish', 'arguments': {'answer': 'B'}}]}
        return {'tool_calls': [{'name': name, 'arguments': args(k)} for k in range(50)]}
    return handler


@pytest.mark.parametrize('method,tool,args,config', [
    ('dvd', 'GlobalBrowse', lambda k: {'query': f'the lamp {k}'}, Config()),
    ('pace-no-verify', 'ClipSearch', lambda k: {'event_description': f'girl {k}'}, Config(pace_protocol='tools'))])
def test_fifty_calls_in_one_reply_stay_within_the_action_budget(method, tool, args, config):
    "N = 15 counts tool calls: 14 run, the rest refused (answered, traced), Finish on the last one; 2 agent calls."
    with FakeChatServer(_flood_server(tool, args)) as srv:
        m = OpenAIHTTPModel(srv.url, retries=0)
        res = answer_pace(Q, toy_db(), method, PaceModels(m, m), config, return_trace=True)
    tr = res['trace_data']
    agent = [p for p in srv.requests if 'tools' in p]
    assert [s['tool'] for s in tr['steps']] == [tool] * 14 + ['Finish'] and res['answer'] == 'B'
    assert len(agent) == 2 and len(srv.requests) <= 2 + 15 and res['llm_calls'] <= 2 + 15
    assert res['refused_calls'] == tr['refused_calls'] == len(tr['refused']) == 36
    assert {r['tool'] for r in tr['refused']} == {tool} and tr['refused'][0]['error'].startswith('over_budget')
    replies = [x for x in agent[1]['messages'] if x['role'] == 'tool']
    assert len(replies) == 50 and sum('ERROR: not run' in x['content'] for x in replies) == 36


def test_the_trace_records_tools_as_json_when_the_server_refuses_tools():
    "vllm serve without a tool parser: the calls go as JSON under a schema, and the trace and result say so."
    refusal = {'error': {'message': 'tool_choice="required" requires --enable-auto-tool-choice and '
                                    '--tool-call-parser to be set'}}
    def handler(payload):
        if 'tools' in payload: return 400, refusal
        items = payload['response_format']['json_schema']['schema']['properties']['tool_calls']['items']
        if 'last turn' in str(payload['messages'][-1].get('content')):          # DVD's last turn: told, not forced
            return json.dumps({'tool_calls': [{'name': 'Finish', 'arguments': {'answer': 'B'}}]})
        return json.dumps({'tool_calls': [{'name': 'ClipSearch', 'arguments': {'event_description': 'girl kicks'}}]})
    with FakeChatServer(handler) as srv:
        res = answer_pace(Q, toy_db(), 'dvd', PaceModels(OpenAIHTTPModel(srv.url, retries=0), None),
                          Config(pace_max_steps=3), return_trace=True)
    tr = res['trace_data']
    assert [s['tool'] for s in tr['steps']] == ['ClipSearch', 'ClipSearch', 'Finish'] and res['answer'] == 'B'
    assert tr['protocol'] == res['protocol'] == 'tools_as_json'
    assert {c['protocol'] for s in tr['steps'] for c in s['calls']} == {'tools_as_json'}


def test_a_native_function_calling_server_is_recorded_as_tools():
    with FakeChatServer(lambda p: {'tool_calls': [{'name': 'Finish', 'arguments': {'answer': 'C'}}]}) as srv:
        res = answer_pace(Q, toy_db(), 'dvd', PaceModels(OpenAIHTTPModel(srv.url, retries=0), None))
    assert (res['protocol'], res['answer'], res['refused_calls']) == ('tools', 'C', 0)


def test_thinking_on_sends_the_switch_and_the_enlarged_budget_with_every_request():
    "Config.thinking='on': every request carries enable_thinking and its role's budget plus the reasoning allowance."
    from reveal_kit.backends.models import get_chat_model
    cfg = Config(thinking='on', reasoning_allowance=1000)
    with FakeChatServer(lambda p: {'tool_calls': [{'name': 'Finish', 'arguments': {'answer': 'B'}}]}) as srv:
        m = get_chat_model('http', 'fake-model', srv.url, cache_mode='off', **cfg.thinking_settings())
        answer_pace(Q, toy_db(), 'dvd', PaceModels(m, None), cfg)
        off = get_chat_model('http', 'fake-model', srv.url, cache_mode='off', thinking='off')
        off.chat('q', role='answerer', max_tokens=cfg.reply_tokens('answerer'))
    assert [(p['chat_template_kwargs'], p['max_tokens']) for p in srv.requests] == [
        ({'enable_thinking': True}, cfg.pace_agent_max_tokens + 1000), ({'enable_thinking': False}, 256)]


def test_a_cut_agent_reply_is_asked_again_with_twice_the_budget():
    "A JSON tool call cut at max_tokens (a thinking model ran out) is retried once, doubled; the record says so."
    def handler(payload):
        if payload['max_tokens'] <= 400: return {'content': '{"tool": "Finish", "argu', 'finish_reason': 'length'}
        return json.dumps({'tool': 'Finish', 'arguments': {'answer': 'B'}})
    with FakeChatServer(handler) as srv:
        res = answer_pace(Q, toy_db(), 'pace-no-verify', PaceModels(OpenAIHTTPModel(srv.url, retries=0), None),
                          return_trace=True)
    call = res['trace_data']['steps'][0]['calls'][0]
    assert res['answer'] == 'B' and res['invalid_calls'] == 0 and call['cut_retry'] is True
    agent = [p for p in srv.requests if 'anyOf' in p['response_format']['json_schema']['schema']]
    assert [p['max_tokens'] for p in agent] == [400, 800]
