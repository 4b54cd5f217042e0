"""Integration tests of REVEAL's retrieve–verify–answer loop (nbs/20..25): thresholds, switches, fallbacks, end to end."""
import json
import zlib

import numpy as np
import pytest

from reveal_kit.core import Config, Evidence, MemoryItem, Question
from reveal_kit.online_memory import OnlineMemory, content_words
from reveal_kit.rubrics import load_rubric_pool
from reveal_kit.planner import Planner, offline_decompose, screen_queries, uniform_sample
from reveal_kit.verifier import is_sufficient, sufficiency_score
from reveal_kit.agent import PRESETS, MethodSpec, answer_question, get_method, load_trace, synthetic_items, format_trace


class HashEmbedder:
    """Deterministic bag-of-stems embedder with the TextEmbedder interface (control-flow tests only)."""
    model_id, dim, is_fallback, why = 'test-hash-64', 64, True, 'test fixture'

    def encode(self, texts):
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in content_words(t):
                out[i, zlib.crc32(w.encode()) % 64] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


EVENTS = {5: 'the man opens the red door and carries a box inside', 30: 'at night the man opens the red door to let the cat out',
          50: 'the man opens the red door for a delivery worker with flowers',
          12: 'a chef cuts onions on a board', 20: 'a dog jumps into the pool', 40: 'a girl plays the violin on stage'}
Q_COUNT = Question('c1', 'syn', 'How many times does the man open the red door?', ['1', '2', '3', '4'], answer='C', qtype='counting')
Q_NEG = Question('n1', 'syn', 'Which of the following is not shown in the video?',
                 ['a chef cuts onions', 'a dog jumps into the pool', 'a pilot lands a plane', 'a girl plays the violin'], answer='C')
Q_ORDER = Question('t1', 'syn', 'In which order do these happen?',
                   ['a girl plays the violin, then a dog jumps into the pool', 'a dog jumps into the pool, then a girl plays the violin'],
                   answer='B')
Q_ACTION = Question('a1', 'syn', 'What does the chef do with the onions?', ['cuts them on a board', 'throws them away', 'fries them'], answer='A')


@pytest.fixture(scope='module')
def hash_memory():
    from reveal_kit.offline_memory import OfflineMemory
    return OfflineMemory.from_items(synthetic_items(60, EVENTS), text_embedder=HashEmbedder())


# --- arithmetic and thresholds -------------------------------------------------------------------------------------

def test_rho_arithmetic_and_threshold():
    w = {'a': 2.0, 'b': 1.0, 'c': 1.0}
    table = {'A': {'a': 1, 'b': 0.5, 'c': 0}, 'B': {'a': 0.5, 'b': 1, 'c': 1}, 'C': {'a': 0, 'b': 0, 'c': 0}}
    rho_o, rho = sufficiency_score(table, w)
    assert rho_o == pytest.approx({'A': 2.5 / 4, 'B': 3.0 / 4, 'C': 0.0})
    assert rho == pytest.approx(0.75) and is_sufficient(rho, 0.7)
    assert not is_sufficient(sufficiency_score({'A': table['A']}, w)[1], 0.7)          # 0.625 < 0.7
    assert sufficiency_score({'A': {'x': 1, 'y': 0.5}}, {'x': 0.4, 'y': 0.6})[1] == pytest.approx(0.7)
    assert is_sufficient(0.7, 0.7) and not is_sufficient(0.6999, 0.7)


def test_query_rejection_at_exact_thresholds():
    vec = {'q070': [0.70, np.sqrt(1 - 0.49)], 'q0699': [0.699, np.sqrt(1 - 0.699 ** 2)]}
    emb = lambda ts: np.array([vec.get(t, [0.0, 1.0]) for t in ts])
    om = OnlineMemory()
    om.admit(Evidence('L1_0', 1, 0, 10, 'x'), np.array([1.0, 0.0]))
    ten = 'w1 w2 w3 w4 w5 w6 w7 w8 w9 w10'
    om.record_attempt(0, 'Text Retrieval', ten, 8, 1)
    kept, rej, _ = screen_queries(['q070', 'q0699', 'w1 w2 w3 w4 w5 w6 w7 w8 w9', 'w1 w2 w3 w4 w5 w6 w7 w8 w11'], om, emb, Config())
    # Jaccard 9/10 = 0.9 → rejected; 8/11 → kept; cosine 0.70 → rejected; 0.699 → kept
    assert kept == ['q0699', 'w1 w2 w3 w4 w5 w6 w7 w8 w11']
    assert [r['query'] for r in rej] == ['q070', 'w1 w2 w3 w4 w5 w6 w7 w8 w9']


def test_admission_dedup_at_0_9():
    om = OnlineMemory(dedup_cosine=0.9)
    assert om.admit(Evidence('a', 1, 0, 1, 'x'), np.array([1.0, 0.0]))[0]
    assert om.admit(Evidence('b', 1, 1, 2, 'y'), np.array([0.9, np.sqrt(0.19)]))[0]           # = 0.9: admitted
    ok, why = om.admit(Evidence('c', 1, 2, 3, 'z'), np.array([0.9001, np.sqrt(1 - 0.9001 ** 2)]))
    assert not ok and why.startswith('near_duplicate')
    assert len(om) == 2 and om.visited == {'a', 'b', 'c'}


def test_negation_one_query_per_option():
    qs = offline_decompose(Q_NEG, Config())
    assert len(qs) == len(Q_NEG.options) and all(len(q.split()) <= 15 for q in qs)
    five = Question('n5', 'v', 'Which is NOT shown?', ['a', 'b b', 'c c', 'd d', 'e e'])
    assert len(offline_decompose(five, Config())) == 5


def test_negation_model_decomposition_enforced():
    from reveal_kit.backends import ScriptedModel
    m = ScriptedModel(lambda messages, schema, role: {'queries': ['animals in the video', 'what is not shown'], 'reasoning': 'x'})
    a = Planner(m, Config(), offline=False).decompose(Q_NEG)
    assert a.queries == offline_decompose(Q_NEG, Config()) and a.source == 'model' and 'negation' in a.notes[0]
    ok = ScriptedModel(lambda messages, schema, role: {'queries': ['chef onions', 'dog pool', 'pilot plane', 'girl violin'], 'reasoning': 'x'})
    assert Planner(ok, Config(), offline=False).decompose(Q_NEG).queries == ['chef onions', 'dog pool', 'pilot plane', 'girl violin']


def test_uniform_sampling_only_unvisited():
    l1 = [MemoryItem(f'L1_{i:03d}', 1, 10 * i, 10 * i + 10, 'x') for i in range(40)]
    visited = {f'L1_{i:03d}' for i in range(0, 40, 3)}
    for n in (1, 5, 8, 40):
        s = uniform_sample(l1, visited, n)
        assert all(it.item_id not in visited for it in s) and len({it.item_id for it in s}) == len(s)
        assert len(s) == min(n, 40 - len(visited))


# --- the loop --------------------------------------------------------------------------------------------------------

def test_presets_switch_exactly_what_they_name():
    f = [k for k in MethodSpec.__dataclass_fields__ if k != 'name']
    diff = lambda a, b: {k for k in f if getattr(PRESETS[a], k) != getattr(PRESETS[b], k)}
    assert diff('base', '+iter') == {'iterative'}
    assert diff('+iter', '+offmem') == {'chunking'}
    assert diff('+offmem', '+onmem') == {'online_memory'}
    assert diff('+onmem', 'reveal') == {'verify', 'rerank'}
    assert diff('reveal', 'rerank_only') == {'verify'}
    assert diff('reveal', 'verify_only') == {'rerank'}
    assert (PRESETS['base'].chunking, PRESETS['reveal'].chunking) == ('fixed', 'adaptive')


def test_presets_behave_as_named(hash_memory):
    res = {p: answer_question(Q_COUNT, hash_memory, None, Config(), p, return_trace=True) for p in PRESETS}
    t = {p: r['trace_data'] for p, r in res.items()}
    assert res['base']['rounds'] == 1
    assert all(it['level'] == 1 for it in t['base']['rounds'][0]['retrieved'])
    assert {it['level'] for it in t['+offmem']['rounds'][0]['retrieved']} == {1, 2, 3}
    assert not t['+offmem']['online_memory']['enabled'] and t['+onmem']['online_memory']['enabled']
    for p in ('base', '+iter', '+offmem', '+onmem', 'rerank_only'):
        assert res[p]['sufficient'] is None and not any('verifier' in rd for rd in t[p]['rounds'])
    for p in ('reveal', 'verify_only'):
        assert all('verifier' in rd for rd in t[p]['rounds'])
    assert [t[p]['rounds'][0]['ranking'] for p in ('reveal', 'rerank_only', 'verify_only')] == ['rubric', 'rubric', 'relevance']
    fixed = answer_question(Q_COUNT, hash_memory, None, Config(), get_method('reveal', fixed_rounds=2, fixed_segments=5))
    assert fixed['rounds'] == 2 and fixed['stop_reason'] == 'budget' and len(fixed['evidence']) <= 10


@pytest.mark.parametrize('K', [1, 2, 3])
def test_loop_stops_at_K(hash_memory, K):
    from reveal_kit.backends import ScriptedModel
    def never_sufficient(messages, schema, role):
        if role == 'verifier':
            props = schema['properties']['rubric_criteria_scores']['properties']
            return {'rubric_criteria_scores': {o: {c: 0 for c in row['properties']} for o, row in props.items()},
                    'unknown_options': list(props), 'missing_evidence_analysis': [f'more evidence {np.random.rand():.6f}']}
        if role == 'verifier_select': return {'criteria': schema['properties']['criteria']['items']['enum'][:2]}
        if role == 'planner_decompose': return {'queries': ['man opens red door', 'red door'], 'reasoning': 'x'}
        if role == 'planner': return {'strategy': 'Uniform Sampling', 'queries': [], 'reasoning': 'x'}
        return {'answer': 'A', 'reasoning': 'x'}
    r = answer_question(Q_COUNT, hash_memory, ScriptedModel(never_sufficient), Config(max_rounds=K), 'reveal', roles='model')
    assert r['rounds'] == K and r['stop_reason'] == 'budget' and r['sufficient'] is False and r['answer'] == 'A'
    assert r['calls_by_role']['verifier'] == K and r['calls_by_role'].get('planner', 0) == K - 1
    assert r['llm_calls'] == 2 * K + 2      # decompose + select + K verify + (K-1) plan + answer


def test_invalid_verifier_json_is_repaired_or_recorded(hash_memory, tmp_path):
    from reveal_kit.backends import ScriptedModel
    def broken_verifier(messages, schema, role):
        if role == 'verifier': return 'the evidence looks fine to me {not json'
        if role == 'verifier_select': return {'criteria': ['distinct_instances']}
        if role == 'planner_decompose': return {'queries': ['man opens red door', 'red door opened'], 'reasoning': 'x'}
        if role == 'planner': return {'strategy': 'Text Retrieval', 'queries': ['door opening'], 'reasoning': 'x'}
        return {'answer': 'C', 'reasoning': 'x'}
    r = answer_question(Q_COUNT, hash_memory, ScriptedModel(broken_verifier), Config(), 'reveal', trace_dir=tmp_path, roles='model')
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
    assert t['rounds'][0]['queries'] and len(t['rounds'][0]['queries']) == 4           # one per option
    for rd in t['rounds']:
        assert {'queries', 'rejected', 'retrieved', 'admitted', 'verifier', 'strategy_executed'} <= set(rd)
        assert all({'item_id', 'level', 't_start', 't_end', 'score'} <= set(a) for a in rd['admitted'])
        assert set(rd['verifier']['table']) == set('ABCD') and 'rho' in rd['verifier']
    assert t['stop_reason'] in ('sufficient', 'budget', 'no_new_evidence')
    assert {'rounds', 'llm_calls', 'prompt_tokens', 'completion_tokens', 'seconds'} <= set(t['totals'])
    assert 'verifier: rho=' in format_trace(t)


# --- end to end with the real packaged text embedder ---------------------------------------------------------------

@pytest.fixture(scope='module')
def minilm_memory():
    from reveal_kit.offline_memory import OfflineMemory
    from reveal_kit.embedders import get_text_embedder
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


def test_cli_ask_json(minilm_memory, monkeypatch, tmp_path):
    import typer
    from typer.testing import CliRunner
    import reveal_kit.agent as agent
    import reveal_kit.backends as backends
    monkeypatch.setattr(agent, '_get_memory', lambda *a, **k: minilm_memory)
    monkeypatch.setattr(backends, 'get_chat_model', lambda *a, **k: None)
    app = typer.Typer(); app.command()(agent.cli_ask)
    video = tmp_path / 'v.mp4'; video.write_bytes(b'')
    out = CliRunner().invoke(app, [str(video), '--question', Q_COUNT.question, *sum((['--option', o] for o in Q_COUNT.options.values()), []),
                                   '--json', '--trace-dir', str(tmp_path / 'tr')])
    assert out.exit_code == 0, out.output
    d = json.loads(out.output.strip().splitlines()[-1])
    assert set(d) == {'answer', 'sufficient', 'rho', 'rounds', 'llm_calls', 'tokens', 'stop_reason', 'evidence', 'trace'}
    assert d['answer'] in 'ABCD' and all('t_start' in e for e in d['evidence'])
    out2 = CliRunner().invoke(app, [str(video), '-q', Q_COUNT.question, '-o', '1', '-o', '2', '--method', 'base', '--trace-dir', str(tmp_path / 'tr')])
    assert out2.exit_code == 0 and 'Answer:' in out2.output and 'Trace:' in out2.output
    def bad_memory(*a, **k): raise ValueError('video not found: nowhere.mp4')
    monkeypatch.setattr(agent, '_get_memory', bad_memory)
    out3 = CliRunner().invoke(app, [str(video), '-q', 'x?', '-o', 'a', '-o', 'b'])
    assert out3.exit_code == 2


# --- the real embedded LLM --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_embedded_llm_loop_completes(tmp_path):
    """The embedded base model (not meaningful) forced into every role: replies are structurally valid or repaired/recorded,
    and the loop still completes with an answer."""
    from reveal_kit.backends import get_chat_model
    from reveal_kit.offline_memory import OfflineMemory
    from reveal_kit.embedders import get_text_embedder
    model = get_chat_model('embedded', cache=None)
    mem = OfflineMemory.from_items(synthetic_items(12, {3: 'the man opens the red door and carries a box inside', 9: 'at night the man opens the red door to let the cat out'}),
                                   text_embedder=get_text_embedder())
    # small prompts keep the CPU time bounded: one round, three evidence items
    r = answer_question(Q_COUNT, mem, model, Config(max_rounds=1), get_method('reveal', fixed_segments=3), trace_dir=tmp_path, roles='model')
    assert not r['failed'] and r['answer'] in Q_COUNT.options, r['error']
    t = load_trace(r['trace'])
    roles = [c['role'] for c in t['calls']]
    assert roles[:2] == ['verifier_select', 'planner_decompose'] and roles[-1] == 'answerer'
    assert r['rounds'] == 1 and r['stop_reason'] in ('sufficient', 'budget', 'no_new_evidence') and r['llm_calls'] == 4
    assert all(rd['verifier']['source'] in ('model', 'fallback') for rd in t['rounds'])
