"""Backends against real counterparts: a real `python -m llama_cpp.server` on 127.0.0.1, the packaged GGUF in-process,
an unreachable URL, a server whose replies are not JSON, and the call cache across two processes."""
import json, os, socket, subprocess, sys, textwrap, time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest

from reveal_kit import backends
from reveal_kit.backends import (BackendUnavailable, FakeChatServer, LlamaCppModel, OpenAIHTTPModel, get_chat_model,
                                 default_llama_threads, json_stats, packaged_gguf_path, system_message, user_message)
from reveal_kit.cache import CacheMiss, CachedModel, CallCache

ANSWER = {'type': 'object', 'properties': {'answer': {'type': 'string', 'enum': ['A', 'B', 'C', 'D']},
                                           'reason': {'type': 'string'}}, 'required': ['answer', 'reason']}
QUERIES = {'type': 'object', 'properties': {'queries': {'type': 'array', 'items': {'type': 'string'}, 'minItems': 1}},
           'required': ['queries']}
PROMPT = [system_message('You answer multiple-choice questions.'),
          user_message('Which colour is the sky on a clear day?\nA. green\nB. blue\nC. red\nD. black')]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]


@pytest.fixture(scope='module')
def gguf():
    return packaged_gguf_path()


@pytest.fixture(scope='module')
def llama_server(gguf, tmp_path_factory):
    "A real llama-cpp-python OpenAI-compatible server on a free loopback port, stopped after the module."
    port, logf = free_port(), tmp_path_factory.mktemp('server') / 'server.log'
    cmd = [sys.executable, '-m', 'llama_cpp.server', '--model', str(gguf), '--host', '127.0.0.1', '--port', str(port),
           '--n_ctx', '2048', '--n_threads', str(default_llama_threads()), '--chat_format', 'gemma']
    with open(logf, 'wb') as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url, t0 = f'http://127.0.0.1:{port}/v1', time.time()
    try:
        while True:
            if proc.poll() is not None: pytest.fail(f"llama_cpp.server exited with {proc.returncode}:\n{logf.read_text()[-3000:]}")
            try:
                if httpx.get(f'{url}/models', timeout=2).status_code == 200: break
            except httpx.TransportError: pass
            if time.time() - t0 > 120: pytest.fail(f"llama_cpp.server not ready after 120 s:\n{logf.read_text()[-3000:]}")
            time.sleep(0.5)
        print(f"llama_cpp.server ready in {time.time() - t0:.1f} s at {url}")
        yield url
    finally:
        proc.terminate()
        try: proc.wait(10)
        except subprocess.TimeoutExpired: proc.kill(); proc.wait()


# --- the HTTP backend against a real llama.cpp server -------------------------------------------------------------

@pytest.mark.server
def test_http_text(llama_server):
    m = OpenAIHTTPModel(llama_server, retries=1)
    assert m.model_id                                   # taken from /v1/models
    r = m.chat(PROMPT, max_tokens=24, role='answerer')
    assert r.ok and r.text.strip()
    assert r.record.prompt_tokens > 10 and 0 < r.record.completion_tokens <= 24
    assert r.record.backend == 'http' and r.record.role == 'answerer' and r.record.latency_s > 0


@pytest.mark.server
@pytest.mark.slow
def test_http_json_schema_with_fallback(llama_server):
    "llama-cpp-python's server rejects response_format json_schema: the model falls back to json_object and remembers."
    m = OpenAIHTTPModel(llama_server, json_mode='json_schema', retries=1)
    r = m.chat(PROMPT, schema=ANSWER, max_tokens=120, role='answerer')
    assert r.ok, r.record.error
    jsonschema.validate(r.data, ANSWER)
    assert m.json_mode == 'json_object'
    r2 = OpenAIHTTPModel(llama_server, json_mode='json_object', retries=1).chat(
        'Write search queries that would find a red car in a video.', schema=QUERIES, max_tokens=200)
    assert r2.ok, r2.record.error
    jsonschema.validate(r2.data, QUERIES)
    assert r2.record.completion_tokens < 200            # the bounded schema stops the grammar well before max_tokens


@pytest.mark.server
def test_http_concurrency(llama_server):
    m = OpenAIHTTPModel(llama_server, max_concurrency=2, retries=1)
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda i: m.chat(f'Count to {i + 2}.', max_tokens=8), range(4)))
    assert all(o.ok for o in outs)


@pytest.mark.server
def test_http_cache_hit(llama_server, tmp_path):
    cm = CachedModel(OpenAIHTTPModel(llama_server, retries=1), CallCache(tmp_path / 'calls'))
    a = cm.chat(PROMPT, schema=ANSWER, max_tokens=120, role='answerer')
    b = cm.chat(PROMPT, schema=ANSWER, max_tokens=120, role='answerer')
    assert a.ok and not a.record.cache_hit and b.record.cache_hit
    assert (b.text, b.data) == (a.text, a.data)
    assert b.record.orig_latency_s == a.record.latency_s and b.record.latency_s < a.record.latency_s
    assert b.record.completion_tokens == a.record.completion_tokens


REPLAY = textwrap.dedent('''
    import json, sys
    from reveal_kit.backends import OpenAIHTTPModel, user_message
    from reveal_kit.cache import CachedModel, CacheMiss
    # the server given here is closed: a replay must never reach it
    m = CachedModel(OpenAIHTTPModel("http://127.0.0.1:9", model=sys.argv[2], retries=0), sys.argv[1], mode="replay")
    r = m.chat([user_message(sys.argv[3])], max_tokens=16, role="answerer")
    out = {"text": r.text, "cache_hit": r.record.cache_hit, "orig": r.record.orig_latency_s}
    try: m.chat([user_message("never asked")], max_tokens=16, role="planner")
    except CacheMiss as e: out["miss"] = str(e)
    print(json.dumps(out))
''')


@pytest.mark.server
def test_cache_across_processes(llama_server, tmp_path):
    "Process 1 records a call against the real server; process 2 replays it with no server, and misses loudly."
    m = OpenAIHTTPModel(llama_server, retries=1)
    cm = CachedModel(m, tmp_path / 'calls')
    a = cm.chat([user_message('Say hello.')], max_tokens=16, role='answerer')
    assert a.ok and not a.record.cache_hit
    p = subprocess.run([sys.executable, '-c', REPLAY, str(tmp_path / 'calls'), m.model_id, 'Say hello.'],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out['cache_hit'] and out['text'] == a.text and out['orig'] == a.record.latency_s
    assert "no cached call for role 'planner'" in out['miss']


# --- the embedded default in-process ---------------------------------------------------------------------------

@pytest.mark.slow
def test_inprocess_packaged_model(gguf, capsys):
    backends._WARNED.clear()                             # the warning prints once per process; make this the first time
    m = LlamaCppModel()
    assert (m.meaningful, m.is_fallback) == (False, True)
    t0, c0 = time.time(), time.process_time()
    r = m.chat('Write search queries that would find a red car in a video.', schema=QUERIES, max_tokens=200, role='planner')
    dt, cpu = time.time() - t0, time.process_time() - c0
    assert r.ok, r.record.error
    jsonschema.validate(r.data, QUERIES)
    assert r.record.completion_tokens < 200
    assert 'answers are not meaningful' in capsys.readouterr().err
    print(f"embedded JSON call (load + grammar): {r.record.completion_tokens} tokens in {dt:.2f} s wall / {cpu:.2f} s CPU")


def test_inprocess_text_tokens_per_second(gguf):
    m = LlamaCppModel()
    m.chat('Hi', max_tokens=4)                           # load once
    t0, c0 = time.time(), time.process_time()
    r = m.chat('The city street was busy.', max_tokens=64, temperature=0.0)
    dt, cpu, n = time.time() - t0, time.process_time() - c0, r.record.completion_tokens
    assert r.ok and n > 0
    print(f"embedded text: {n} tokens in {dt:.2f} s wall / {cpu:.2f} s CPU = {n / dt:.1f} tok/s wall, {n / cpu:.1f} tok/s per CPU-second")


# --- faults ------------------------------------------------------------------------------------------------------

def test_unreachable_url_names_it():
    port = free_port()                                   # bound and released: nothing listens there now
    m = OpenAIHTTPModel(f'http://127.0.0.1:{port}/v1', model='x', retries=1, backoff=0.05, timeout=3)
    t0 = time.time()
    with pytest.raises(BackendUnavailable, match=f'http://127.0.0.1:{port}/v1/chat/completions'):
        m.chat('hello')
    assert time.time() - t0 < 5


def test_server_answer_not_json():
    "A server whose content is never JSON: one repair request with the error, then a recorded, counted failure."
    before = json_stats().get('failures', 0)
    with FakeChatServer(lambda payload: 'The answer is B because the sky is blue.') as srv:
        m = OpenAIHTTPModel(srv.url, retries=0)
        r = m.chat(PROMPT, schema=ANSWER, role='answerer')
        assert (r.ok, r.data, r.record.repaired) == (False, None, True)
        assert 'invalid JSON after one repair' in r.record.error
        assert len(srv.requests) == 2 and 'invalid' in srv.requests[1]['messages'][-1]['content']
    assert m.stats['failures'] == 1 and json_stats()['failures'] == before + 1


def test_server_answer_repaired():
    replies = iter(['{"answer": "B"', '{"answer": "B", "reason": "blue"}'])
    with FakeChatServer(lambda payload: next(replies)) as srv:
        r = OpenAIHTTPModel(srv.url, retries=0).chat(PROMPT, schema=ANSWER)
    assert (r.ok, r.data['answer'], r.record.repaired) == (True, 'B', True)


def test_failed_call_not_cached(tmp_path):
    with FakeChatServer(lambda payload: 'no json here') as srv:
        cm = CachedModel(OpenAIHTTPModel(srv.url, retries=0), tmp_path / 'calls')
        assert not cm.chat(PROMPT, schema=ANSWER).ok
        assert len(cm.cache) == 0
        with pytest.raises(CacheMiss):
            CachedModel(OpenAIHTTPModel(srv.url, retries=0), tmp_path / 'calls', mode='replay').chat(PROMPT, schema=ANSWER)


def test_get_chat_model_http_cached(tmp_path):
    with FakeChatServer(lambda payload: 'pong') as srv:
        m = get_chat_model('http', base_url=srv.url, cache=tmp_path / 'calls')
        assert [m.chat('ping').record.cache_hit for _ in range(2)] == [False, True]
        assert len(srv.requests) == 1
