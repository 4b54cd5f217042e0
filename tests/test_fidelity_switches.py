"""Issue 30, last items: every method's trace records the run's data switches, through the runner and through the
HTTP backend (`testing.simulator` behind `FakeChatServer`); DVD's own index caps (4,096 tokens, plus a thinking
model's allowance); DVD's last turn through `answer_pace`."""
import json, os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reveal_kit.core import Config
from reveal_kit.cli.main import app
from reveal_kit.record import SWITCHES
from reveal_kit.eval.runner import run_eval
from reveal_kit.synth.bench import generate_benchmark
from reveal_kit.testing.fakes import FakeChatServer, HashEmbedder
from reveal_kit.testing.simulator import ModelSimulator, SimSettings
from reveal_kit.testing.videos import make_test_video
from reveal_kit.backends.chat import ScriptedModel, set_thinking
from reveal_kit.pace.dvd import dvd_index_config
from reveal_kit.pace.index import get_pace_dbs

METHODS = ('blind', 'direct', 'reveal', 'pace', 'dvd')


@pytest.fixture(scope='module')
def work(minute_bench):
    "A one-minute generated video with one question, its memories and indexes under one REVEAL_RUNS."
    return minute_bench


def traces(out: Path) -> list[dict]:
    "The trace of every result row of a run."
    rows = [json.loads(l) for l in (out / 'results.jsonl').read_text().splitlines() if l.strip()]
    assert rows
    return [json.loads(Path(r['trace']).read_text()) for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize('method', METHODS)
def test_every_method_trace_records_the_run_switches(work, method):
    "A run without subtitles: each method's trace says so, beside footage-before-query and the embedders that ran."
    out = work / 'offline' / method
    run_eval('synth', method, out, root=work / 'bench', backend='none', overrides=['subtitles=false'],
             progress=False)
    meta = json.loads((out / 'run.json').read_text())
    for t in traces(out):
        s = t['switches']
        assert set(s) == set(SWITCHES) and (s['subtitles'], s['before_query']) == (False, True)
        assert s['subtitles'] == meta['input']['subtitles']
        if method in ('reveal', 'pace', 'dvd'): assert s['text_embedder'] == t['models']['text_embedder']
        if method == 'reveal': assert s['image_embedder']
    caps = meta['index_caps']
    assert caps == ({'caption_max_tokens': 4096, 'registry_max_tokens': 4096} if method == 'dvd' else
                    {'caption_max_tokens': 600, 'registry_max_tokens': 800} if method == 'pace' else None)


@pytest.mark.slow
@pytest.mark.parametrize('method', ['reveal', 'dvd', 'direct'])
def test_a_run_through_the_http_backend_records_the_switches(work, method):
    "`reveal eval run --backend http` against the simulated VLM server: the traces carry the run's switches."
    sim = ModelSimulator(settings=SimSettings(delay_s=0.0))
    out = work / 'http' / method
    with FakeChatServer(sim, model='sim-vlm') as srv:
        r = CliRunner().invoke(app, ['eval', 'run', 'synth', '-m', method, '--root', str(work / 'bench'), '--out',
                                     str(out), '--backend', 'http', '--base-url', srv.url, '--model', 'sim-vlm',
                                     '--cache', 'off', '--timeout', '20', '--quiet', '--set', 'subtitles=false'])
    assert r.exit_code == 0, r.output
    if method == 'dvd':                            # DVD's plain index, captioned by the served VLM: DVD's caps
        row = json.loads((out / 'results.jsonl').read_text().splitlines()[0])
        man = json.loads((Path(row['index']['plain_path']) / 'manifest.json').read_text())
        assert man['config']['pace_caption_max_tokens'] == man['config']['pace_tool_max_tokens'] == 4096
    for t in traces(out):
        assert (t['switches']['subtitles'], t['switches']['before_query']) == (False, True)
        assert t['models']['chat'].startswith('http:') or method == 'direct'


def test_dvd_index_captions_and_merge_at_dvds_cap_plus_the_thinking_allowance(tmp_path):
    "DVD's plain index: its caption and registry-merge calls ask for 4,096 tokens, plus the allowance when thinking."
    video = make_test_video(tmp_path / 'v.mp4', [(3, 1), (3, 2)], fps=4)
    girl = {'name': 'girl', 'appearance': ['red'], 'identity': ['a girl'], 'first_seen': '00:00:00'}
    def reply(messages, schema, role):
        if role == 'pace_registry': return {'subjects': [girl]}
        return {'subjects': [girl], 'description': 'a girl in red'}
    vlm = set_thinking(ScriptedModel(reply), 'on', 1000)
    get_pace_dbs(video, (), dvd_index_config(Config()), vlm, root=tmp_path / 'idx', text_embedder=HashEmbedder())
    budgets = {(c['role'], c['max_tokens']) for c in vlm.calls}
    assert {r for r, _ in budgets} >= {'pace_caption', 'pace_registry'}
    assert {b for r, b in budgets if r in ('pace_caption', 'pace_registry')} == {4096 + 1000}
    pace = set_thinking(ScriptedModel(reply), 'off', 1000)                 # PACE's own plain index keeps its caps
    get_pace_dbs(video, (), Config(), pace, root=tmp_path / 'idx2', text_embedder=HashEmbedder())
    assert {c['max_tokens'] for c in pace.calls if c['role'] == 'pace_caption'} == {600}
