"""Integration tests of REVEAL's retrieve–verify–answer loop (nbs/21..25) on the real memory store: switches, the
round budget with a scripted model, fallbacks, traces, `ask`, and end to end with the packaged text embedder."""
import json

import numpy as np
import pytest

from reveal_kit.core import Config, Question
from reveal_kit.backends.chat import ScriptedModel
from reveal_kit.memory.store import OfflineMemory
from reveal_kit.testing.fakes import HashEmbedder, synthetic_items
from reveal_kit.testing.scripted import StampedFrames
from reveal_kit.reveal.presets import PRESETS, get_preset
from reveal_kit.reveal.ask import ASK_JSON_KEYS, load_trace, format_trace
from reveal_kit.reveal.agent import answer_question
import reveal_kit.reveal.ask as agent
from reveal_kit.cli.present import format_ask_summary


EVENTS = {5: 'the man opens the red door and carries a box inside',
          30: 'at night the man opens the red door to let the cat out',
          50: 'the man opens the red door for a delivery worker with flowers',
          12: 'a chef cuts onions on a board', 20: 'a dog jumps into the pool', 40: 'a girl plays the violin on stage'}
Q_COUNT = Question('c1', 'syn', 'How many times does the man open the red door?', ['1', '2', '3', '4'],
                   answer='C', qtype='counting')
Q_NEG = Question('n1', 'syn', 'Which of the following is not shown in the video?',
                 ['a chef cuts onions', 'a dog jumps into the pool', 'a pilot lands a plane',
                  'a girl plays the violin'], answer='C')
Q_ORDER = Question('t1', 'syn', 'In which order do these happen?',
                   ['a girl plays the violin, then a dog jumps into the pool',
                    'a dog jumps into the pool, then a girl plays the violin'], answer='B')
Q_ACTION = Question('a1', 'syn', 'What does the chef do with the onions?',
                    ['cuts them on a board', 'throws them away', 'fries them'], answer='A')


@pytest.fixture(scope='module')
def hash_memory():
    return OfflineMemory.from_items(synthetic_items(60, EVENTS), text_embedder=HashEmbedder())


def scripted(fn):
    "A scripted chat model answering by role."
    return ScriptedModel(lambda messages, schema, role: fn(role, schema))


# --- the loop on the real memory store ---------------------------------------------------------------------------

def test_presets_behave_as_named(hash_memory):
    res = {p: answer_question(Q_COUNT, hash_memory, None, Config(), p, return_trace=True) for p in PRESETS}
    t = {p: r['trace_data'] for p, r in res.items()}
    assert res['base']['rounds'] == 1
    assert all(it['level'] == 1 for it in t['base']['rounds'][0]['retrieved'])
    assert {it['level'] for it in t['+offmem']['rounds'][0]['retrieved']} == {1, 2, 3}
    assert not t['+offmem']['online_memory']['enabled'] and t['+onmem']['online_memory']['enabled']
    for p in ('base', '+iter', '+offmem', '+onmem', 'rerank-only'):
        assert res[p]['sufficient'] is None and not any('verifier' in rd for rd in t[p]['rounds'])
    for p in ('reveal', 'verify-only'):
        assert all('verifier' in rd for rd in t[p]['rounds'])
    rankings = [t[p]['rounds'][0]['ranking'] for p in ('reveal', 'rerank-only', 'verify-only')]
    assert rankings == ['rubric-offline', 'rubric-offline', 'relevance']
    spec = get_preset('reveal', fixed_rounds=2, fixed_segments=5)
    fixed = answer_question(Q_COUNT, hash_memory, None, Config(), spec)
    assert fixed['rounds'] == 2 and fixed['stop_reason'] == 'budget' and len(fixed['evidence']) <= 10


def never_sufficient(role, schema):
    "Every score 0, a fresh missing-evidence line each round (so screening never rejects the repair query)."
    if role == 'verifier':
        props = schema['properties']['rubric_criteria_scores']['properties']
        return {'rubric_criteria_scores': {o: {c: 0 for c in row['properties']} for o, row in props.items()},
                'unknown_options': list(props), 'missing_evidence_analysis': [f'more evidence {np.random.rand():.6f}']}
    if role == 'verifier_select':
        return {'criteria': schema['properties']['criteria']['items']['enum'][:2]}
    if role == 'planner_decompose':
        return {'queries': ['man opens red door', 'red door'], 'reasoning': 'x'}
    if role == 'planner':
        return {'strategy': 'Uniform Sampling', 'queries': [], 'reasoning': 'x'}
    if role == 'reranker':
        return {'scores': {k: 0.5 for k in schema['properties']['scores']['required']}}
    if role == 'relevance':
        return {'relevant': False, 'reasoning': 'x'}
    return {'answer': 'A', 'reasoning': 'x'}


@pytest.mark.parametrize('K', [1, 2, 3])
def test_loop_stops_at_K(hash_memory, K):
    r = answer_question(Q_COUNT, hash_memory, scripted(never_sufficient), Config(max_rounds=K), 'reveal', roles='model')
    assert r['rounds'] == K and r['stop_reason'] == 'budget' and r['sufficient'] is False and r['answer'] == 'A'
    assert r['calls_by_role']['verifier'] == K and r['calls_by_role'].get('planner', 0) == K - 1
    assert r['calls_by_role']['reranker'] == K and not r['degraded']
    assert r['llm_calls'] == 3 * K + 2      # decompose + select + K rerank + K verify + (K-1) plan + answer
    off = answer_question(Q_COUNT, hash_memory, scripted(never_sufficient), Config(max_rounds=K),
                          get_preset('reveal', rerank_by='offline'), roles='model')
    assert off['llm_calls'] == 2 * K + 2 and 'reranker' not in off['calls_by_role']   # REVEAL Table 4's count


def test_invalid_verifier_json_is_repaired_or_recorded(hash_memory, tmp_path):
    def broken_verifier(role, schema):
        if role == 'verifier':
            return 'the evidence looks fine to me {not json'
        if role == 'verifier_select':
            return {'criteria': ['distinct_instances']}
        if role == 'planner_decompose':
            return {'queries': ['man opens red door', 'red door opened'], 'reasoning': 'x'}
        if role == 'planner':
            return {'strategy': 'Text Retrieval', 'queries': ['door opening'], 'reasoning': 'x'}
        return {'answer': 'C', 'reasoning': 'x'}
    r = answer_question(Q_COUNT, hash_memory, scripted(broken_verifier), Config(), 'reveal', trace_dir=tmp_path,
                        roles='model')
    assert not r['failed'] and r['answer'] == 'C'
    t = load_trace(r['trace'])
    vcalls = [c for c in t['calls'] if c['role'] == 'verifier']
    assert vcalls and all(c['ok'] is False for c in vcalls)                            # recorded as failed calls
    v0 = t['rounds'][0]['verifier']
    assert v0['source'] == 'fallback' and any('unusable' in n for n in v0['notes'])    # offline scores used instead
    assert set(v0['table']['A']) == {'distinct_instances'}


def test_trace_contents(hash_memory, tmp_path):
    r = answer_question(Q_NEG, hash_memory, None, Config(), 'reveal', trace_dir=tmp_path)
    t = json.loads(open(r['trace']).read())
    assert len(t['rounds'][0]['queries']) == 4           # one per option
    for rd in t['rounds']:
        assert {'queries', 'rejected', 'retrieved', 'admitted', 'verifier', 'strategy_executed'} <= set(rd)
        assert all({'item_id', 'level', 't_start', 't_end', 'score'} <= set(a) for a in rd['admitted'])
        assert set(rd['verifier']['table']) == set('ABCD') and 'rho' in rd['verifier']
    assert t['stop_reason'] in ('sufficient', 'budget', 'no_new_evidence') and not t['failed']
    assert {'rounds', 'llm_calls', 'prompt_tokens', 'completion_tokens', 'seconds'} <= set(t['totals'])
    assert 'verifier: rho=' in format_trace(t)


# --- end to end with the real packaged text embedder ---------------------------------------------------------------

@pytest.fixture(scope='module')
def minilm_memory():
    from reveal_kit.retrieval.choice import get_text_embedder
    return OfflineMemory.from_items(synthetic_items(60, EVENTS, seed=1), text_embedder=get_text_embedder())


def test_end_to_end_offline_roles_real_embedder(minilm_memory, tmp_path):
    qs = [Q_COUNT, Q_NEG, Q_ORDER, Q_ACTION]
    res = [answer_question(q, minilm_memory, None, Config(), 'reveal', trace_dir=tmp_path) for q in qs]
    assert all(not r['failed'] and r['answer'] in q.options for r, q in zip(res, qs))
    assert sum(r['correct'] for r in res) >= 3, [(r['qid'], r['answer'], r['stop_reason']) for r in res]
    assert all(r['llm_calls'] == 0 and r['rounds'] <= 3 for r in res)
    assert all(load_trace(r['trace'])['models']['text_embedder'] == minilm_memory.text_embedder.model_id for r in res)
    base = [answer_question(q, minilm_memory, None, Config(), 'base') for q in qs]
    assert all(b['rounds'] == 1 and b['answer'] in q.options for b, q in zip(base, qs))


def test_ask(minilm_memory, monkeypatch, tmp_path):
    seen = []
    def fake_memory(video, memory_dir, config, chat, subtitles):
        seen.append((video.name, memory_dir, config.chunking, config.tau, subtitles))
        return minilm_memory, None
    monkeypatch.setattr(agent, '_get_memory', fake_memory)
    monkeypatch.setattr(agent, 'get_chat_model', lambda *a, **k: None)
    video = tmp_path / 'v.mp4'
    res = agent.ask(video, Q_COUNT.question, list(Q_COUNT.options.values()), trace_dir=tmp_path / 'tr',
                    overrides=['tau=0.8'], memory=tmp_path / 'mem')
    assert set(ASK_JSON_KEYS) - {'memory_dir'} <= set(res) and res['answer'] in 'ABCD' and res['tau'] == 0.8
    assert res['trace_error'] is None and res['degraded'] is False and res['failed_calls'] == {}
    assert all('t_start' in e for e in res['evidence']) and load_trace(res['trace'])['qid'] == 'ask'
    json.dumps({k: res[k] for k in ASK_JSON_KEYS}, default=str)
    assert seen[-1] == ('v.mp4', tmp_path / 'mem', 'adaptive', 0.8, None)
    out = format_ask_summary(res)
    assert out.startswith(f"Answer: {res['answer']}.") and out.endswith(f"Trace: reveal trace show {res['trace']}")
    base = agent.ask(video, Q_COUNT.question, ['1', '2'], method='base', trace_dir=tmp_path / 'tr')
    assert base['rounds'] == 1 and seen[-1][2] == 'fixed' and seen[-1][1] is None   # the method's memory kind
    video.write_bytes(b'x')
    (tmp_path / 'v.srt').write_text('1\n00:00:01,000 --> 00:00:02,000\nhello\n')
    res = agent.ask(video, Q_COUNT.question, ['1', '2'], trace_dir=tmp_path / 'tr')
    assert seen[-1][4] == tmp_path / 'v.srt' and res['subtitles'] == str(tmp_path / 'v.srt')   # the file beside it
    def bad_memory(*a, **k):
        raise ValueError('video not found: nowhere.mp4')
    monkeypatch.setattr(agent, '_get_memory', bad_memory)
    with pytest.raises(ValueError, match='video not found'):
        agent.ask(video, 'x?', ['a', 'b'])


# --- the real embedded LLM --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_embedded_llm_loop_completes(tmp_path):
    """The embedded base model (not meaningful) forced into every role: replies are structurally valid or
    repaired/recorded, and the loop still completes with an answer."""
    from reveal_kit.backends.models import get_chat_model
    from reveal_kit.retrieval.choice import get_text_embedder
    model = get_chat_model('embedded', cache=None)
    events = {3: 'the man opens the red door and carries a box inside',
              9: 'at night the man opens the red door to let the cat out'}
    mem = OfflineMemory.from_items(synthetic_items(12, events), text_embedder=get_text_embedder())
    # small prompts keep the CPU time bounded: one round, three evidence items
    r = answer_question(Q_COUNT, mem, model, Config(max_rounds=1), get_preset('reveal', fixed_segments=3),
                        trace_dir=tmp_path, roles='model')
    assert not r['failed'] and r['answer'] in Q_COUNT.options, r['error']
    t = load_trace(r['trace'])
    roles = [c['role'] for c in t['calls']]
    assert roles[:3] == ['verifier_select', 'planner_decompose', 'reranker'] and roles[-1] == 'answerer'
    assert r['rounds'] == 1 and r['stop_reason'] in ('sufficient', 'budget', 'no_new_evidence') and r['llm_calls'] == 5
    assert all(rd['verifier']['source'] in ('model', 'fallback') for rd in t['rounds'])


# --- degraded results, misbehaving servers, traces, --memory roots, oracle evidence -------------------------------

def test_degraded_result_counts_failed_calls(hash_memory, tmp_path):
    "A verifier whose replies are never valid JSON: the answer stands, but the result says it is not the model's."
    def bad_verifier(role, schema):
        return 'fine {not json' if role == 'verifier' else never_sufficient(role, schema)
    r = answer_question(Q_COUNT, hash_memory, scripted(bad_verifier), Config(), 'reveal', trace_dir=tmp_path,
                        roles='model')
    assert not r['failed'] and r['degraded'] and r['failed_calls'] == {'verifier': r['rounds']}
    t = load_trace(r['trace'])
    assert t['degraded'] and t['failed_calls'] == r['failed_calls']
    ok = answer_question(Q_COUNT, hash_memory, scripted(never_sufficient), Config(), 'reveal', roles='model')
    assert ok['degraded'] is False and ok['failed_calls'] == {}


@pytest.mark.parametrize('body', ['<html><body>It works!</body></html>', {'object': 'list', 'data': []}])
def test_misbehaving_server_stops_with_one_line(hash_memory, body):
    "HTTP 200 with a body that is not a chat completion: the question stops with one error naming the URL and the body."
    from reveal_kit.backends.chat import BackendUnavailable
    from reveal_kit.backends.http import OpenAIHTTPModel
    from reveal_kit.testing.fakes import FakeChatServer
    with FakeChatServer(lambda payload: (200, body)) as srv:
        m = OpenAIHTTPModel(srv.url, model='m', retries=0)
        with pytest.raises(BackendUnavailable) as e:
            answer_question(Q_COUNT, hash_memory, m, Config(), 'reveal', roles='model')
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and f'the last 5 calls to {srv.url} failed' in msg
    assert (b'It works' if isinstance(body, str) else b'"object"').decode() in msg


def test_half_failing_server_is_degraded_not_silent(hash_memory):
    "Every second call of the server is garbage: the run goes on, and every result says which calls failed."
    from reveal_kit.backends.http import OpenAIHTTPModel
    from reveal_kit.testing.fakes import FakeChatServer
    n = {'i': 0}
    def flaky(payload):
        n['i'] += 1
        if n['i'] % 2: return 200, 'Internal error page'
        schema = (payload.get('response_format') or {}).get('json_schema', {}).get('schema', {})
        return json.dumps(never_sufficient(_role_of(schema), schema))
    with FakeChatServer(flaky) as srv:
        r = answer_question(Q_COUNT, hash_memory, OpenAIHTTPModel(srv.url, model='m', retries=0), Config(), 'reveal',
                            roles='model')
    assert r['degraded'] and sum(r['failed_calls'].values()) >= r['llm_calls'] // 2
    assert r['models']['base_url'] == srv.url


def _role_of(schema):
    "Which role a schema belongs to (by its properties)."
    props = set(schema.get('properties', {}))
    for role, key in (('verifier', 'rubric_criteria_scores'), ('verifier_select', 'criteria'),
                      ('planner_decompose', 'queries'), ('planner', 'strategy')):
        if key in props:
            return role if not (role == 'planner_decompose' and 'strategy' in props) else 'planner'
    return 'answerer'


def test_trace_names_are_injective(hash_memory, tmp_path):
    ids = ['a/b', 'a_b', 'a:b', 'q' * 130 + 'x', 'q' * 130 + 'y']
    paths = [answer_question(Question(i, 'syn', Q_COUNT.question, ['1', '2']), hash_memory, None, Config(), 'base',
                             trace_dir=tmp_path)['trace'] for i in ids]
    assert len(set(paths)) == len(ids) and all(load_trace(p)['qid'] == i for p, i in zip(paths, ids))


def test_ask_trace_dirs_unique_and_trace_failure_keeps_answer(minilm_memory, monkeypatch, tmp_path):
    monkeypatch.setattr(agent, '_get_memory', lambda *a: (minilm_memory, None))
    monkeypatch.setattr(agent, 'get_chat_model', lambda *a, **k: None)
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))
    a, b = (agent.ask(tmp_path / 'v.mp4', Q_COUNT.question, ['1', '2', '3', '4']) for _ in range(2))
    assert a['trace'] != b['trace'] and load_trace(a['trace'])['answer'] == a['answer']
    (tmp_path / 'file').write_text('x')
    ro = agent.ask(tmp_path / 'v.mp4', Q_COUNT.question, ['1', '2', '3', '4'], trace_dir=tmp_path / 'file' / 'tr')
    assert ro['answer'] == a['answer'] and ro['trace'] is None and ro['trace_error'].startswith('trace not written')
    assert format_ask_summary(ro).endswith(f"Trace: not written ({ro['trace_error']})")


@pytest.mark.parametrize('options,question,why', [(['only one'], 'Why?', 'at least 2 options'),
                                                  ([f'o{i}' for i in range(27)], 'Why?', 'at most 26 options'),
                                                  (['a', ' '], 'Why?', 'empty option'),
                                                  (['a', 'b'], ' ', 'empty question')])
def test_ask_refuses_bad_input_before_work(monkeypatch, options, question, why):
    monkeypatch.setattr(agent, 'get_chat_model', lambda *a, **k: pytest.fail('a model was made for bad input'))
    with pytest.raises(ValueError, match=why):
        agent.ask('no-video.mp4', question, options)
    with pytest.raises(KeyError, match='presets: '):
        agent.ask('no-video.mp4', 'Why?', ['a', 'b'], method='revael')


def test_ask_passes_cache_and_timeout(minilm_memory, monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(agent, '_get_memory', lambda *a: (minilm_memory, None))
    monkeypatch.setattr(agent, 'get_chat_model', lambda *a, **k: seen.update(k))
    agent.ask(tmp_path / 'v.mp4', 'x?', ['a', 'b'], trace_dir=tmp_path, cache='replay', timeout_s=7)
    assert (seen['cache_mode'], seen['timeout_s']) == ('replay', 7)
    agent.ask(tmp_path / 'v.mp4', 'x?', ['a', 'b'], trace_dir=tmp_path, overrides=[])
    assert seen['cache_mode'] == 'readwrite' and seen['timeout_s'] == getattr(Config(), 'timeout_s', None)


def test_memory_option_is_a_root_of_memories(tmp_path, monkeypatch):
    "`--memory DIR`: one memory per memory-config key under DIR; DIR itself when it already is this memory."
    video = tmp_path / 'clip.mp4'
    video.write_bytes(b'not really a video, but hashable')
    built = []
    monkeypatch.setattr(agent.OfflineMemory, 'build', classmethod(lambda cls, v, d, *a, **k: built.append(d) or d))
    root = tmp_path / 'mems'
    for chunking in ('adaptive', 'fixed', 'adaptive'):
        agent._get_memory(video, root, Config(chunking=chunking), None, None)[0]
    assert built[0] == built[2] != built[1] and all(p.parent == root for p in built)
    key = built[1].name.rsplit('-', 1)[-1]
    legacy = tmp_path / 'legacy'                         # a memory written straight into DIR (fixed chunking)
    legacy.mkdir()
    (legacy / 'manifest.json').write_text(json.dumps({'memory_key': key, 'video_sha256':
                                                      agent.content_sha256(video)}))
    assert agent._get_memory(video, legacy, Config(chunking='fixed'), None, None)[0] == legacy
    assert agent._get_memory(video, legacy, Config(chunking='adaptive'), None, None)[0].parent == legacy


def test_oracle_evidence(hash_memory, tmp_path):
    "`+oracle`: the annotated segments are the evidence, with source 'oracle', and the trace lists them."
    q = Question('o1', 'syn', 'What does the delivery worker carry?', ['flowers', 'a pizza', 'a box'], answer='A',
                 evidence_spans=[(501.0, 503.0)])
    r = answer_question(q, hash_memory, None, Config(), 'base+oracle', trace_dir=tmp_path)
    t = load_trace(r['trace'])
    assert [i['item_id'] for i in t['oracle']['items']] == ['L1_0050'] and t['spec']['oracle_evidence']
    assert r['evidence'][0]['item_id'] == 'L1_0050' and r['evidence'][0]['source'] == 'oracle'
    plain = answer_question(q, hash_memory, None, Config(), 'base', return_trace=True)
    assert plain['trace_data']['oracle'] is None and all(e['source'] != 'oracle' for e in plain['evidence'])
    assert get_preset('verify_only+oracle').verify and not get_preset('verify_only+oracle').rerank


def test_oracle_frames_arm_sends_the_annotated_segments_frames(hash_memory, monkeypatch):
    "`+oracle-frames`: an image-capable HTTP answerer gets the annotated segments' frames; `+oracle` none."
    from reveal_kit.backends.chat import minimal_instance
    from reveal_kit.backends.messages import message_images, image_to_data_url
    from reveal_kit.backends.http import OpenAIHTTPModel
    from reveal_kit.testing.fakes import FakeChatServer
    frame = lambda t: np.full((8, 8, 3), int(t) % 256, np.uint8)
    monkeypatch.setattr(hash_memory, 'frames', lambda item, n=None: [frame(item.t_start)] * n, raising=False)
    q = Question('of1', 'syn', 'What does the delivery worker carry?', ['flowers', 'a pizza'], answer='A',
                 evidence_spans=[(501.0, 503.0)])
    reply = lambda p: json.dumps(minimal_instance(p['response_format']['json_schema']['schema']))
    def answer_images(srv):
        schemas = [p['response_format']['json_schema']['schema'] for p in srv.requests]
        req = [p for p, s in zip(srv.requests, schemas) if 'answer' in s['properties']]
        return [u for m in req[-1]['messages'] for u in message_images(m)]
    with FakeChatServer(reply) as srv:
        m = OpenAIHTTPModel(srv.url, model='m', retries=0)
        r = answer_question(q, hash_memory, m, Config(), 'base+oracle-frames', roles='model', return_trace=True)
        assert answer_images(srv) == [image_to_data_url(frame(500))] * 10        # 1 fps over the 10-s segment
        fr = r['trace_data']['answer_frames']
        assert (fr['route'], fr['frames'], fr['items']) == ('oracle', 10, [{'item_id': 'L1_0050', 't_start': 500.0,
                                                                            't_end': 510.0, 'frames': 10}])
        assert r['rounds'] == 0 and [c['role'] for c in r['trace_data']['calls']] == ['answerer']   # no retrieval
        answer_question(q, hash_memory, m, Config(), 'base+oracle', roles='model')
        assert answer_images(srv) == []                                          # the captions-only arm
    off = answer_question(q, hash_memory, None, Config(), 'base+oracle-frames', return_trace=True)
    assert off['trace_data']['answer_frames']['frames'] == 0 and not off['failed']
    assert off['trace_data']['answer_frames']['note'] == 'answerer cannot take images: text only'


# --- issue 21: the loop, its roles, the baselines and the oracle arm as the paper specifies them ------------------

Q_AFTER = Question('t2', 'syn', 'What happens right after the chef cuts onions on a board?',
                   ['a dog jumps into the pool', 'a girl plays the violin on stage',
                    'the man opens the red door and carries a box inside'], answer='A', qtype='temporal_order')
Q_NOT_ACTION = Question('n2', 'syn', 'Which of the following is not depicted in the video?',
                        ['a chef cuts onions', 'a dog jumps into the pool', 'a pilot lands a plane',
                         'a girl plays the violin'], answer='C', qtype='Action Recognition')


def _images_sent(model, role='answerer'):
    "Images in the last request of `role` a ScriptedModel received."
    from reveal_kit.backends.messages import message_images
    reqs = [c for c in model.calls if c['role'] == role]
    return [u for m in reqs[-1]['messages'] for u in message_images(m)] if reqs else []


def test_offline_rerank_includes_the_question_anchor(hash_memory):
    "Item 2: the offline rerank scores candidates against the question's own anchor too ('right after X')."
    from reveal_kit.reveal.rerank import rerank_targets
    assert 'the chef cuts onions on a board' in rerank_targets(Q_AFTER, [])
    r = answer_question(Q_AFTER, hash_memory, None, Config(), 'rerank_only', return_trace=True)
    rd = r['trace_data']['rounds'][0]
    assert 'L1_0012' in [a['item_id'] for a in rd['admitted']] and rd['ranking'] == 'rubric-offline'
    assert r['rerank'] == 'rubric-offline'


def test_model_rerank_is_one_call_per_round_scoring_the_candidates(hash_memory):
    "Item 2: with a model, the rubric rerank is one model call per round over the merged candidates and criteria."
    seen = []
    def fn(messages, schema, role):
        if role == 'reranker':
            user = messages[-1]['content'] if isinstance(messages[-1]['content'], str) else str(messages[-1]['content'])
            seen.append(user)
            ids = schema['properties']['scores']['required']
            return {'scores': {i: (1 if 'delivery worker' in user.split(f'[{i}]')[1].split('\n')[0] else 0)
                               for i in ids}}
        return never_sufficient(role, schema)
    m = ScriptedModel(fn)
    r = answer_question(Q_COUNT, hash_memory, m, Config(max_rounds=2), 'reveal', roles='model', return_trace=True)
    assert r['calls_by_role']['reranker'] == r['rounds'] == 2 and r['rerank'] == 'rubric-model'
    rd = r['trace_data']['rounds'][0]
    names = r['trace_data']['criteria']['names']
    assert rd['ranking'] == 'rubric-model' and 'Rubric:' in seen[0] and all(n in seen[0] for n in names)
    assert rd['admitted'][0]['item_id'] == 'L1_0050'          # the one candidate the model scored 1 comes first


def test_relevance_stop_for_the_rows_without_a_verifier(hash_memory):
    "Item 3: +iter, +offmem and +onmem stop once the retrieved evidence is judged relevant (stop reason 'relevant')."
    for p in ('+iter', '+offmem', '+onmem'):
        r = answer_question(Q_COUNT, hash_memory, None, Config(), p)
        assert (r['stop_reason'], r['rounds']) == ('relevant', 1), (p, r['stop_reason'], r['rounds'])
    def judge(flag):
        return scripted(lambda role, schema: {'relevant': flag, 'reasoning': 'x'} if role == 'relevance'
                        else never_sufficient(role, schema))
    yes = answer_question(Q_COUNT, hash_memory, judge(True), Config(), '+onmem', roles='model')
    no = answer_question(Q_COUNT, hash_memory, judge(False), Config(), '+onmem', roles='model')
    assert (yes['stop_reason'], yes['rounds'], yes['calls_by_role']['relevance']) == ('relevant', 1, 1)
    assert no['stop_reason'] != 'relevant' and no['calls_by_role']['relevance'] == no['rounds'] - 1 >= 1  # not the last


def test_negation_is_read_from_the_question_text(hash_memory):
    "Item 4: a 'not depicted' question typed 'Action Recognition' is decomposed one query per option."
    from reveal_kit.reveal.planner import offline_decompose, decompose_prompt
    assert len(offline_decompose(Q_NOT_ACTION)) == 4 and 'one query per option' in decompose_prompt(Q_NOT_ACTION)
    r = answer_question(Q_NOT_ACTION, hash_memory, None, Config(), 'reveal', return_trace=True)
    assert len(r['trace_data']['rounds'][0]['queries']) == 4 and r['trace_data']['negation'] is True
    assert r['qtype'] == 'action'                              # the reporting category stays the benchmark's


def test_direct_sees_frames_not_captions(hash_memory):
    "Item 6: `direct` sends uniform frames and no captions; the captions variant keeps its own name."
    from reveal_kit.eval.baselines import direct
    from reveal_kit.eval.methods import available_methods
    mem = StampedFrames(hash_memory)
    m = ScriptedModel(lambda messages, schema, role: {'answer': 'C'})
    r = direct(Q_COUNT, mem, m, Config(direct_max_frames=16))
    prompt = str(m.calls[-1]['messages'])
    assert r['evidence'] == [] and 'opens the red door' not in prompt and len(_images_sent(m, m.calls[-1]['role'])) == 16
    assert 'direct-captions' in available_methods()


def test_offline_answerer_never_runs_the_verifier_scoring(hash_memory, monkeypatch):
    "Item 7: the offline answerer does not call the verifier's scoring (offline_scores) nor read its directions."
    import reveal_kit.reveal.answerer as ans
    monkeypatch.setattr(ans, 'offline_scores', lambda *a, **k: pytest.fail('answerer ran the verifier'), raising=False)
    r = answer_question(Q_COUNT, hash_memory, None, Config(), 'reveal', return_trace=True)
    assert r['answer'] == 'C' and 'rho_o' not in str(r['trace_data']['answer_notes'])


def test_option_in_the_anchor_segment_is_undetermined():
    "Item 7: an option located in the anchor's own segment is undetermined for the offline verifier, not ruled out."
    from reveal_kit.core import Evidence
    from reveal_kit.reveal.offline_checks import EvidenceView, offline_scores
    from reveal_kit.reveal.rubrics import load_rubric_pool
    from reveal_kit.reveal.answerer import offline_answer
    q = Question('t3', 'syn', 'What happens right after the chef cuts the onions?',
                 ['the chef fries the onions', 'the dog jumps into the pool'], answer='A', qtype='temporal_order')
    ev = [Evidence('L1_0001', 1, 10, 20, 'the chef cuts the onions and then the chef fries the onions', 0),
          Evidence('L1_0000', 1, 0, 10, 'the dog jumps into the pool', 0)]       # B happens before the anchor
    emb = HashEmbedder()
    view = EvidenceView(ev, emb.encode([e.text for e in ev]).astype(np.float64), emb.encode)
    pool = load_rubric_pool()
    sc = offline_scores(q, pool.for_type('temporal_order'), view)
    assert sc.directions['A'] == 'unknown'                       # old code: 'ruled_out' (strict < on midpoints)
    assert offline_answer(q, view, pool).answer == 'A'            # and the answerer can still choose it


def test_oracle_arm_judges_the_target_time_evidence_without_retrieval(hash_memory):
    "Item 8: `+oracle` answers from the annotated segments only — no retrieval — capped like retrieved evidence."
    q = Question('o2', 'syn', 'What does the man do with the red door?', ['opens it', 'paints it'], answer='A',
                 evidence_spans=[(0.0, 150.0)])                  # 15 overlapping L1 segments
    r = answer_question(q, hash_memory, None, Config(), 'reveal+oracle', return_trace=True)
    t = r['trace_data']
    assert t['rounds'] == [] and r['rounds'] == 0 and r['stop_reason'] == 'oracle'
    assert len(r['evidence']) == Config().rerank_to and all(e['source'] == 'oracle' for e in r['evidence'])


def test_answer_frames_are_routed_by_duration(hash_memory):
    "Item 9 (B.2): ≤ 10 min → uniform 1 fps over the whole video (capped); longer → dense inside the retrieved spans."
    mem = StampedFrames(hash_memory)                            # 600 s: a 10-minute video
    m = ScriptedModel(lambda messages, schema, role: never_sufficient(role, schema))
    r = answer_question(Q_COUNT, mem, m, Config(max_rounds=1), get_preset('reveal', answer_max_frames=12),
                        roles='model', return_trace=True)
    fr = r['trace_data']['answer_frames']
    assert (fr['route'], fr['frames']) == ('uniform', 12) and len(_images_sent(m)) == 12
    long_mem = StampedFrames(OfflineMemory.from_items(synthetic_items(120, EVENTS), text_embedder=HashEmbedder()))
    m2 = ScriptedModel(lambda messages, schema, role: never_sufficient(role, schema))
    r2 = answer_question(Q_COUNT, long_mem, m2, Config(max_rounds=1), 'reveal', roles='model', return_trace=True)
    fr2 = r2['trace_data']['answer_frames']
    spans = [(e['t_start'], e['t_end']) for e in r2['evidence'] if e['level'] == 1]
    assert fr2['route'] == 'spans' and fr2['frames'] == len(_images_sent(m2)) == sum(int(b - a) for a, b in spans)


def test_evidence_is_cut_by_a_token_budget_not_200_words():
    "Item 11: a ~300-word L3 narrative reaches the verifier whole."
    from reveal_kit.core import Evidence
    from reveal_kit.reveal.verifier import evidence_block
    l3 = Evidence('L3_0000', 3, 0, 600, ' '.join(f'w{i}' for i in range(300)), 0)
    assert 'w299' in evidence_block([l3])


def test_trace_records_the_embedder_the_thresholds_were_used_with(hash_memory):
    "Item 11: the 0.9 / 0.70 cosine thresholds are BGE-M3's; the trace says which embedder they met."
    t = answer_question(Q_COUNT, hash_memory, None, Config(), 'reveal', return_trace=True)['trace_data']
    th = t['thresholds']
    assert (th['admit_dedup_cosine'], th['query_cosine_reject'], th['text_embedder']) == (0.9, 0.7, 'test-hash-64')
    assert th['paper_embedder'] == 'BGE-M3' and any('BGE-M3' in w for w in t['warnings'])
