"""A fleet of OpenAI-compatible replicas against real local servers: spread, a replica killed mid-run, recovery after
the cooldown, every replica down; and memory building with concurrent model calls, byte-identical to one at a time."""
import hashlib, json, threading, time
from pathlib import Path

import pytest

from reveal_kit.backends.cache import CachedModel, CallCache
from reveal_kit.backends.chat import BackendUnavailable, minimal_instance
from reveal_kit.backends.messages import message_text
from reveal_kit.core import Config, Question
from reveal_kit.backends.http import OpenAIHTTPModel
from reveal_kit.memory.store import OfflineMemory
from reveal_kit.backends.models import describe_chat_model, get_chat_model
from reveal_kit.testing.fakes import FakeChatServer
from reveal_kit.testing.videos import make_test_video


class Counting:
    "A handler that echoes the prompt after `delay` s and counts requests answered and in flight."
    def __init__(self, delay: float = 0.05, fail: bool = False):
        self.delay, self.fail, self.lock = delay, fail, threading.Lock()
        self.answered, self.now, self.peak = 0, 0, 0

    def __call__(self, payload):
        if self.fail: return 503, {'error': 'restarting'}
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        time.sleep(self.delay)
        with self.lock:
            self.now -= 1
            self.answered += 1
        return message_text(payload['messages'][-1])


def prompts(n: int) -> list[str]:
    return [f'question {i}' for i in range(n)]


def test_spread_is_even_under_concurrency():
    hs = [Counting() for _ in range(3)]
    with FakeChatServer(hs[0]) as a, FakeChatServer(hs[1]) as b, FakeChatServer(hs[2]) as c:
        m = OpenAIHTTPModel(f'{a.url},{b.url},{c.url}', model='m')
        outs = m.chat_many(prompts(60), max_workers=12)
    assert [o.text for o in outs] == prompts(60)
    counts = [h.answered for h in hs]
    assert sum(counts) == 60 and min(counts) >= 14, counts              # 20 each when perfectly even
    assert max(h.peak for h in hs) <= 6, [h.peak for h in hs]          # 12 in flight over 3 servers, not piled on one
    assert {o.record.base_url for o in outs} == {a.url, b.url, c.url}


def test_replica_killed_mid_run_loses_and_duplicates_nothing():
    hs = [Counting() for _ in range(3)]
    a, b, c = (FakeChatServer(h).__enter__() for h in hs)
    try:
        m = OpenAIHTTPModel([a.url, b.url, c.url], model='m', cooldown_s=60)
        box = {}
        run = threading.Thread(target=lambda: box.update(outs=m.chat_many(prompts(90), max_workers=6)))
        run.start()
        while hs[1].answered < 5: time.sleep(0.01)
        b.__exit__(None, None, None)                                    # replica b goes away mid-run
        run.join(60)
        outs = box['outs']
    finally:
        a.__exit__(None, None, None)
        c.__exit__(None, None, None)
    assert [o.text for o in outs] == prompts(90) and all(o.ok for o in outs)
    assert sum(h.answered for h in hs) == 90                            # every call answered exactly once
    st = {s['url']: s for s in m.replicas.status()}
    assert st[b.url]['failures'] >= 1 and not st[b.url]['healthy']
    assert hs[0].answered > hs[1].answered and hs[2].answered > hs[1].answered


def test_replica_failing_with_503_mid_run_is_taken_out_and_back_after_cooldown():
    good, flaky = Counting(), Counting()
    with FakeChatServer(good) as a, FakeChatServer(flaky) as b:
        m = OpenAIHTTPModel([a.url, b.url], model='m', cooldown_s=0.3)
        flaky.fail = True
        outs = m.chat_many(prompts(20), max_workers=4)
        assert [o.text for o in outs] == prompts(20)
        assert (good.answered, flaky.answered) == (20, 0)
        assert m.replicas.status()[1]['failures'] >= 1
        flaky.fail = False
        time.sleep(0.4)                                                 # past the cooldown
        outs = m.chat_many(prompts(20), max_workers=4)
        assert [o.text for o in outs] == prompts(20)
        assert flaky.answered >= 5 and good.answered + flaky.answered == 40


def test_slow_replica_is_skipped_and_the_call_resent():
    slow, fast = Counting(delay=3.0), Counting(delay=0.0)
    with FakeChatServer(slow) as a, FakeChatServer(fast) as b:
        m = OpenAIHTTPModel([a.url, b.url], model='m', timeout=0.5, cooldown_s=60)
        outs = [m.chat(p) for p in prompts(4)]
    assert [o.text for o in outs] == prompts(4) and fast.answered == 4
    assert m.replicas.status()[0]['failures'] == 1                     # asked once, then out for the cooldown


def test_all_replicas_down_is_one_line_naming_them():
    with FakeChatServer(Counting()) as a, FakeChatServer(Counting()) as b:
        urls = [a.url, b.url]
    m = OpenAIHTTPModel(urls, model='m', retries=1, backoff=0.01, timeout=2)
    with pytest.raises(BackendUnavailable) as e:
        m.chat('hi')
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and 'all 2 chat servers at' in msg and 'are unavailable after' in msg
    assert all(f'{u}/chat/completions' in msg for u in urls)
    with FakeChatServer(Counting(fail=True)) as a, FakeChatServer(Counting(fail=True)) as b:
        m = OpenAIHTTPModel([a.url, b.url], model='m', retries=1, backoff=0.01)
        with pytest.raises(BackendUnavailable, match='HTTP 503'):
            m.chat_many(prompts(4), max_workers=2)


def test_bad_json_is_a_model_error_not_replica_health():
    schema = {'type': 'object', 'required': ['answer'], 'properties': {'answer': {'enum': ['A', 'B']}}}
    with FakeChatServer(lambda p: 'Answer: B') as a, FakeChatServer(lambda p: 'Answer: C') as b:
        m = OpenAIHTTPModel([a.url, b.url], model='m', cooldown_s=60)
        res = [m.chat('which?', schema=schema) for _ in range(2)]
        n = len(a.requests) + len(b.requests)
    assert [r.ok for r in res] == [False, False] and n == 4             # each call: the reply and one repair
    assert all('invalid JSON after one repair' in r.record.error for r in res)
    assert all(s['healthy'] and s['failures'] == 0 for s in m.replicas.status())


def test_fleet_through_get_chat_model_describe_and_the_cache_key(tmp_path):
    m = get_chat_model('http', model='m', base_url='http://127.0.0.1:9, http://127.0.0.1:10/v1', cache=tmp_path / 'c')
    d = describe_chat_model(m)
    assert d['base_urls'] == ['http://127.0.0.1:9/v1', 'http://127.0.0.1:10/v1'] and len(d['replicas']) == 2
    one = CachedModel(OpenAIHTTPModel('http://127.0.0.1:9', model='m'), CallCache(tmp_path / 'c'))
    assert m.key('hi') == one.key('hi')                                 # adding replicas keeps cached calls valid


def test_runner_spreads_questions_over_the_fleet(tmp_path):
    from reveal_kit.eval.runner import run_eval
    def reply(payload):
        rf = payload.get('response_format') or {}
        return json.dumps(minimal_instance(rf.get('json_schema', {}).get('schema'))) if rf else 'ok'
    qs = [Question(f'q{i}', 'v', f'What happens in scene {i}?', {'A': 'x', 'B': 'y'}, 'A') for i in range(8)]
    with FakeChatServer(reply) as a, FakeChatServer(reply) as b:
        s = run_eval(qs, 'blind', tmp_path / 'run', backend='http', base_url=f'{a.url},{b.url}', concurrency=4,
                     cache_mode='off', progress=False)
        n = (len(a.requests), len(b.requests))
    rows = [json.loads(l) for l in (tmp_path / 'run' / 'results.jsonl').read_text().splitlines()]
    assert s['ran'] == 8 and sorted(r['qid'] for r in rows) == sorted(q.qid for q in qs)
    assert min(n) >= 2 and sum(n) >= 8, n


def deterministic(delay: float):
    "A caption/summary reply that depends only on the prompt, after `delay` s; `peak` counts requests in flight."
    st = {'now': 0, 'peak': 0}
    lock = threading.Lock()
    def handler(payload):
        with lock:
            st['now'] += 1
            st['peak'] = max(st['peak'], st['now'])
        time.sleep(delay)
        with lock: st['now'] -= 1
        text = message_text(payload['messages'][-1])
        return f"{hashlib.sha256(text.encode()).hexdigest()[:10]} {' '.join(text.split()[6:16])}"
    return handler, st


MEMORY_FILES = ('l1.jsonl', 'l2.jsonl', 'l3.jsonl', 'text_ids.json', 'text_emb.npy', 'visual.npy')


def test_concurrent_memory_build_is_byte_identical_to_sequential(tmp_path):
    video = make_test_video(tmp_path / 'v.mp4', [(6, 1), (6, 2), (6, 3), (6, 4), (6, 5), (6, 6)], fps=2)
    cfg = Config(chunking='fixed', fixed_chunk_s=3.0, l2_group=3, l3_group=2)
    handler, st = deterministic(0.1)
    servers = [FakeChatServer(handler).__enter__() for _ in range(3)]
    try:
        built = {}
        for name, urls, n in (('seq', servers[0].url, 1), ('conc', servers[0].url, 6),
                              ('fleet', [s.url for s in servers], None)):
            st['peak'] = 0
            m = OfflineMemory.build(video, tmp_path / name, cfg, chat_model=OpenAIHTTPModel(urls, model='vlm'),
                                    progress=False, concurrency=n)
            built[name] = ({f: (m.path / f).read_bytes() for f in MEMORY_FILES}, st['peak'])
            assert m.manifest['counts']['n_l1'] == 12 and m.manifest['counts']['n_l2'] == 4
            assert m.manifest['caption_fallbacks'] == 0
    finally:
        for s in servers: s.__exit__(None, None, None)
    assert built['conc'][0] == built['seq'][0] and built['fleet'][0] == built['seq'][0]
    assert built['seq'][1] == 1 and built['conc'][1] >= 3 and built['fleet'][1] >= 3
    ids = [json.loads(l)['item_id'] for l in built['conc'][0]['l1.jsonl'].decode().splitlines()]
    assert ids == [f'L1_{i:04d}' for i in range(12)]


def test_concurrent_build_resumes_after_a_dead_server(tmp_path):
    video = make_test_video(tmp_path / 'v.mp4', [(6, 1), (6, 2), (6, 3)], fps=2)
    cfg = Config(chunking='fixed', fixed_chunk_s=3.0, l2_group=3)
    handler, _ = deterministic(0.05)
    with FakeChatServer(handler) as srv:
        ref = OfflineMemory.build(video, tmp_path / 'ref', cfg, chat_model=OpenAIHTTPModel(srv.url, model='vlm'),
                                  progress=False, concurrency=1)
        url = srv.url
    dead = OpenAIHTTPModel(url, model='vlm', retries=0)
    with pytest.raises(BackendUnavailable):
        OfflineMemory.build(video, tmp_path / 'm', cfg, chat_model=dead, progress=False, concurrency=4)
    assert not (tmp_path / 'm' / 'manifest.json').exists()
    with FakeChatServer(handler) as srv:
        m = OfflineMemory.build(video, tmp_path / 'm', cfg, chat_model=OpenAIHTTPModel(srv.url, model='vlm'),
                                progress=False, concurrency=4)
    for f in MEMORY_FILES: assert (m.path / f).read_bytes() == (ref.path / f).read_bytes(), f


def test_tool_calls_over_a_fleet_with_a_replica_down():
    "Function calling goes through the fleet like chat: a replica answering 503 is skipped, every call answered once."
    tools = [{'type': 'function', 'function': {'name': 'finish', 'parameters': {
        'type': 'object', 'properties': {'answer': {'type': 'string'}}, 'required': ['answer']}}}]
    served = []
    def good(payload):
        assert payload['tools'] == tools and payload['tool_choice'] == 'required'
        served.append(message_text(payload['messages'][-1]))
        return {'tool_calls': [{'name': 'finish', 'arguments': {'answer': message_text(payload['messages'][-1])}}]}
    with FakeChatServer(good) as a, FakeChatServer(Counting(fail=True)) as b:
        m = OpenAIHTTPModel([a.url, b.url], model='m', cooldown_s=60, retries=1, backoff=0.01)
        outs = [None] * 12
        def one(i): outs[i] = m.chat_tools(f'q{i}', tools, role='agent')
        ts = [threading.Thread(target=one, args=(i,)) for i in range(12)]
        for t in ts: t.start()
        for t in ts: t.join()
    assert [o.calls[0].arguments['answer'] for o in outs] == [f'q{i}' for i in range(12)]
    assert all(o.ok and o.record.base_url == a.url for o in outs)
    assert sorted(served) == sorted(f'q{i}' for i in range(12))          # each answered once
    assert m.replicas.status()[1]['healthy'] is False
