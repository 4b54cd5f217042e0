"""Backends against real counterparts: a real `python -m llama_cpp.server` on 127.0.0.1, the packaged GGUF in-process,
fake servers for replies a real model rarely gives, and the call cache across two processes."""
import json, socket, subprocess, sys, textwrap, time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest

from reveal_kit.backends import llamacpp
from reveal_kit.backends.cache import CacheMiss, CachedModel, CallCache
from reveal_kit.backends.messages import system_message, user_message
from reveal_kit.backends.http import OpenAIHTTPModel
from reveal_kit.backends.llamacpp import LlamaCppModel, default_llama_threads, packaged_gguf_path
from reveal_kit.backends.models import get_chat_model
from reveal_kit.testing.fakes import FakeChatServer

ANSWER = {'type': 'object', 'properties': {'answer': {'type': 'string', 'enum': ['A', 'B', 'C', 'D']},
                                           'reason': {'type': 'string'}}, 'required': ['answer', 'reason']}
QUERIES = {'type': 'object', 'properties': {'queries': {'type': 'array', 'items': {'type': 'string'}, 'minItems': 1}},
           'required': ['queries']}
PROMPT = [system_message('You answer multiple-choice questions.'),
          user_message('Which colour is the sky on a clear day?\nA. green\nB. blue\nC. red\nD. black')]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def gguf():
    return packaged_gguf_path()


def _wait_ready(proc, url: str, logf, limit_s: float = 120) -> None:
    "Poll `url/models` until the server answers; fail with its log if it exits or never answers."
    t0 = time.time()
    while True:
        if proc.poll() is not None:
            pytest.fail(f"llama_cpp.server exited with {proc.returncode}:\n{logf.read_text()[-3000:]}")
        try:
            if httpx.get(f'{url}/models', timeout=2).status_code == 200: return
        except httpx.TransportError: pass
        if time.time() - t0 > limit_s:
            pytest.fail(f"llama_cpp.server not ready after {limit_s:.0f} s:\n{logf.read_text()[-3000:]}")
        time.sleep(0.5)


@pytest.fixture(scope='module')
def llama_server(gguf, tmp_path_factory):
    "A real llama-cpp-python OpenAI-compatible server on a free loopback port, stopped after the module."
    port, logf = free_port(), tmp_path_factory.mktemp('server') / 'server.log'
    cmd = [sys.executable, '-m', 'llama_cpp.server', '--model', str(gguf), '--host', '127.0.0.1', '--port', str(port),
           '--n_ctx', '2048', '--n_threads', str(default_llama_threads()), '--chat_format', 'gemma']
    with open(logf, 'wb') as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f'http://127.0.0.1:{port}/v1'
    try:
        _wait_ready(proc, url, logf)
        yield url
    finally:
        proc.terminate()
        try: proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- the HTTP backend against a real llama.cpp server -------------------------------------------------------------

@pytest.mark.server
def test_http_text(llama_server):
    m = OpenAIHTTPModel(llama_server, retries=1)
    assert m.model_id                                   # taken from /v1/models
    r = m.chat(PROMPT, max_tokens=24, role='answerer')
    assert r.ok and r.text.strip()
    assert r.record.prompt_tokens > 10 and 0 < r.record.completion_tokens <= 24
    assert r.record.backend == 'http' and r.record.role == 'answerer'


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
    assert b.record.orig_latency_s == a.record.latency_s
    assert b.record.completion_tokens == a.record.completion_tokens


REPLAY = textwrap.dedent('''
    import json, sys
    from reveal_kit.backends.messages import user_message
    from reveal_kit.backends.http import OpenAIHTTPModel
    from reveal_kit.backends.cache import CachedModel, CacheMiss
    # the same server URL (it is part of the cache key), but a replay must never reach it
    def never(*a, **k): raise AssertionError("replay reached the server")
    OpenAIHTTPModel._request = never
    m = CachedModel(OpenAIHTTPModel(sys.argv[4], model=sys.argv[2], retries=0), sys.argv[1], mode="replay")
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
    p = subprocess.run([sys.executable, '-c', REPLAY, str(tmp_path / 'calls'), m.model_id, 'Say hello.', llama_server],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out['cache_hit'] and out['text'] == a.text and out['orig'] == a.record.latency_s
    assert "no cached call for role 'planner'" in out['miss']


# --- the embedded default in-process ---------------------------------------------------------------------------

@pytest.mark.slow
def test_inprocess_packaged_model(gguf, capsys):
    llamacpp._WARNED.clear()                             # the warning prints once per process; make this the first time
    m = LlamaCppModel()
    assert (m.meaningful, m.is_fallback) == (False, True)
    r = m.chat('Write search queries that would find a red car in a video.', schema=QUERIES, max_tokens=200,
               role='planner')
    assert r.ok, r.record.error
    jsonschema.validate(r.data, QUERIES)
    assert r.record.completion_tokens < 200
    assert 'answers are not meaningful' in capsys.readouterr().err


# --- faults (fake servers: replies a real model gives rarely) -----------------------------------------------------

def test_server_answer_repaired():
    "A reply cut short once: the repair request gets a valid one."
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
            replay = CachedModel(OpenAIHTTPModel(srv.url, retries=0), tmp_path / 'calls', mode='replay')
            replay.chat(PROMPT, schema=ANSWER)


def test_get_chat_model_http_cached(tmp_path):
    with FakeChatServer(lambda payload: 'pong') as srv:
        m = get_chat_model('http', base_url=srv.url, cache=tmp_path / 'calls')
        assert [m.chat('ping').record.cache_hit for _ in range(2)] == [False, True]
        assert len(srv.requests) == 1


def test_not_a_chat_completion_names_url_and_bytes():
    "HTTP 200 with a web page or JSON of another API: a recorded failure naming the URL and the first bytes."
    for body, shown in (('<!DOCTYPE html><title>Router login</title>', "b'<!DOCTYPE html><title>Router login"),
                        ({'detail': 'Not Found'}, 'no choices[0].message')):
        with FakeChatServer(lambda payload: (200, body)) as srv:
            r = OpenAIHTTPModel(srv.url, model='m', retries=0).chat(PROMPT, schema=ANSWER, role='answerer')
        assert not r.ok and r.record.error.startswith(f'{srv.url}/chat/completions answered')
        assert shown in r.record.error


def test_timeout_fails_in_one_line():
    "A server slower than timeout_s: one BackendUnavailable line naming the URL and the limit, no retries."
    from reveal_kit.backends.chat import BackendUnavailable
    def slow(payload):
        time.sleep(3)
        return 'late'
    with FakeChatServer(slow) as srv:
        m = get_chat_model('http', 'm', srv.url, cache_mode='off', timeout_s=0.3)
        with pytest.raises(BackendUnavailable) as e:
            m.chat(PROMPT)
        assert len(srv.requests) == 1
    assert len(str(e.value).splitlines()) == 1
    assert f'{srv.url}/chat/completions did not answer within 0.3 s' in str(e.value)


def test_cache_key_holds_base_url(tmp_path):
    "The same model name on two servers: two cache entries; the base URL is recorded beside the model id."
    with FakeChatServer(lambda payload: 'one') as a, FakeChatServer(lambda payload: 'two') as b:
        ma = get_chat_model('http', 'same-name', a.url, cache=tmp_path / 'calls')
        mb = get_chat_model('http', 'same-name', b.url, cache=tmp_path / 'calls')
        ra, rb = ma.chat('hi'), mb.chat('hi')
        assert (ra.text, rb.text) == ('one', 'two') and len(ma.cache) == 2
        assert (ra.record.base_url, mb.chat('hi').record.cache_hit) == (a.url, True)
    replay = get_chat_model('http', 'same-name', a.url, cache=tmp_path / 'calls', cache_mode='replay')
    assert replay.chat('hi').text == 'one'                 # the server is gone: the cache answers
    with pytest.raises(CacheMiss):
        other = get_chat_model('http', 'same-name', 'http://127.0.0.1:9', cache=tmp_path / 'calls', cache_mode='replay')
        other.chat('hi')


def test_embedded_why_without_llama_cpp(monkeypatch):
    "llama-cpp-python is an optional extra: the embedded backend's `why` says how to install it."
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'llama_cpp' else real(name, *a))
    assert "pip install 'reveal-kit[embedded]'" in LlamaCppModel().why
