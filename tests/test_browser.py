"""The run browser and the trace timeline in a real browser: headless Chromium renders a run page (two runs compared)
and a trace page, its script runs (the filter count is filled in), and each is screenshotted. Skipped, saying why,
only where Debian's `chromium` is not installed (`apt-get install -y chromium`)."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reveal_kit.eval.browser import write_run_browser
from reveal_kit.eval.runner import run_eval
from reveal_kit.synth.bench import generate_benchmark

CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')
# CI (`.ci/run` installs it) must not skip: there a missing browser is a failure, not a skip
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not os.environ.get('CI'),
                                    reason="headless Chromium is not installed (Debian: apt-get install -y chromium)")
SHOTS = Path(os.environ.get('REVEAL_SCREENSHOTS', '')) if os.environ.get('REVEAL_SCREENSHOTS') else None


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    "A generated benchmark answered by base and reveal, and the browser of reveal beside base."
    d = tmp_path_factory.mktemp('browser')
    old = os.environ.get('REVEAL_RUNS')
    os.environ['REVEAL_RUNS'] = str(d / 'runs')
    generate_benchmark(d / 'bench', minutes=1.0, videos=1, questions_per_video=4, size=(320, 180), progress=False)
    for m in ('base', 'reveal'): run_eval('synth', m, d / m, root=d / 'bench', progress=False)
    s = write_run_browser(d / 'reveal', d / 'site' / 'run.html', compare=d / 'base', thumbs=True)
    yield d, s
    if old is None: os.environ.pop('REVEAL_RUNS', None)
    else: os.environ['REVEAL_RUNS'] = old


def chromium(*args: str) -> subprocess.CompletedProcess:
    "Headless Chromium with no network (every host resolves to nothing) and a throwaway profile."
    return subprocess.run([CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars',
                           '--host-resolver-rules=MAP * ~NOTFOUND', *args], capture_output=True, text=True, timeout=120)


def shoot(page: Path, png: Path, size: str) -> Path:
    "A screenshot of a local page (kept in $REVEAL_SCREENSHOTS too, when set, for a person to look at)."
    r = chromium(f'--window-size={size}', f'--screenshot={png}', page.as_uri())
    assert png.is_file() and png.stat().st_size > 10_000, r.stderr[-2000:]
    if SHOTS:
        SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(png, SHOTS / png.name)
    return png


def test_pages_are_static_and_escaped(site):
    "No page fetches anything; the data sits in escaped text and attributes, never inside the script."
    d, s = site
    pages = [d / 'site' / 'run.html', *sorted((d / 'site' / 'run_traces').glob('*.html'))]
    assert s['traces'] == s['questions'] > 0 and len(pages) == s['questions'] + 1
    for p in pages:
        html = p.read_text()
        assert not re.search(r"""(src|href|url)\s*[=(]\s*['"]?(https?:)?//""", html), p
        assert html.count('<script') <= 1


@needs_chromium
def test_run_page_in_chromium(site, tmp_path):
    "The run page renders, its script runs (the shown count is filled in), and it is screenshotted."
    d, s = site
    dom = chromium('--dump-dom', (d / 'site' / 'run.html').as_uri()).stdout
    n = s['questions']
    assert f"<span id=\"shown\">{n}</span> of {n} questions shown" in dom          # the script ran
    assert dom.count('<tr class=') == n and 'A vs B' in dom
    shoot(d / 'site' / 'run.html', tmp_path / 'run_page.png', '1300,700')


@needs_chromium
def test_trace_page_with_timeline_in_chromium(site, tmp_path):
    "A trace page with its timeline (gold spans, rounds, admitted items) renders and is screenshotted."
    d, _ = site
    page = sorted((d / 'site' / 'run_traces').glob('*.html'))[0]
    dom = chromium('--dump-dom', page.as_uri()).stdout
    assert "class=\"timeline\"" in dom and 'gold evidence' in dom and 'round 0 admitted' in dom
    shoot(page, tmp_path / 'trace_page.png', '1100,1300')


# ---------------------------------------------------------------- PACE and DVD runs, odd data, any folder, any size
TURNS = [('ClipSearch', {'event_description': 'blue robot drum'}),
         ('FrameInspect', {'question': 'what happens?', 'time_ranges_hhmmss': [['00:00:10', '00:00:20']]}),
         ('Finish', {'answer': 'B'})]


def _fake_handler(payload):
    "A model server's replies: the agent searches, inspects 0:10–0:20 and finishes (DVD by function calling, PACE"
    " by JSON); every other role gets the smallest JSON its schema allows."
    from reveal_kit.backends.replies import minimal_instance
    if payload.get('tools'):
        n = sum(m['role'] == 'assistant' for m in payload['messages'])
        name, args = TURNS[min(n, 2)]
        return {'content': 'looking', 'tool_calls': [{'name': name, 'arguments': args}], 'reasoning': 'search first'}
    schema = ((payload.get('response_format') or {}).get('json_schema') or {}).get('schema')
    if schema is None: return 'ok'
    tools = [b['properties']['tool']['enum'][0] for b in schema.get('anyOf') or []
             if 'tool' in b.get('properties', {})]
    if tools:                                                    # PACE's agent: one call a step, as JSON
        n = json.dumps(payload['messages']).count('\\nCall: ')
        name, args = next((t for t in TURNS[min(n, 2):] if t[0] in tools), ('Finish', {'answer': 'B'}))
        return json.dumps({'tool': name, 'arguments': args})
    return json.dumps(minimal_instance(schema))


@pytest.fixture(scope='module')
def agent_runs(tmp_path_factory):
    "PACE and DVD runs of one generated video: offline, and with a model behind an OpenAI-compatible server."
    from reveal_kit.testing.fakes import FakeChatServer
    d = tmp_path_factory.mktemp('agents')
    old = os.environ.get('REVEAL_RUNS')
    os.environ['REVEAL_RUNS'] = str(d / 'runs')
    generate_benchmark(d / 'bench', minutes=1.0, videos=1, questions_per_video=3, size=(320, 180), progress=False)
    runs = {m: d / m for m in ('pace', 'dvd')}
    for m in ('pace', 'dvd'): run_eval('synth', m, runs[m], root=d / 'bench', progress=False)
    with FakeChatServer(_fake_handler) as srv:
        for m in ('pace', 'dvd'):
            runs[f'{m}-http'] = d / f'{m}-http'
            run_eval('synth', m, runs[f'{m}-http'], root=d / 'bench', backend='http', base_url=srv.url,
                     model='fake-model', progress=False)
    yield d, runs
    if old is None: os.environ.pop('REVEAL_RUNS', None)
    else: os.environ['REVEAL_RUNS'] = old


def _cli():
    from reveal_kit.cli.main import app
    from reveal_kit.testing.commands import cli_for
    return cli_for(app)


def _trace_files(run: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run / 'traces').glob('*.json'))]


def test_every_pace_and_dvd_run_has_a_browser_with_its_tool_calls(agent_runs, tmp_path):
    "`trace show RUN --html` and `trace show RUN QID [--html]` on real runs: every tool call, its arguments, ranges."
    from reveal_kit.cli.share import trace_show
    cli = _cli()
    _, runs = agent_runs
    for name, run in runs.items():
        r = cli(trace_show, run, '--html', tmp_path / name / 'run.html')
        assert r.exit_code == 0, (name, r.output)
        traces = _trace_files(run)
        assert traces and all(isinstance(t['rounds'], int) and t['steps'] for t in traces)
        if name.endswith('-http'): assert any(t['llm_calls'] for t in traces), name     # a model answered
        for t in traces:
            page = tmp_path / name / f"{t['qid']}.html"
            r = cli(trace_show, run, t['qid'], '--html', page)
            assert r.exit_code == 0, (name, r.output)
            html = page.read_text()
            assert f"Tool calls ({len(t['steps'])})" in html and 'Evidence (' in html
            for s in t['steps']:
                assert f"<td>{s['tool']}</td>" in html and f"step {s['step'] + 1} {s['tool']}" in html
                assert f" {s['tool']} " in r.output                     # the terminal lists each tool call
            for s in t['steps']:
                for a, b in (s['arguments'] or {}).get('time_ranges_hhmmss') or []:
                    assert f"{a}" in html and f"ranges=" in r.output
        site = (tmp_path / name / 'run_traces')
        assert len(list(site.glob('*.html'))) == len(traces)


def test_frame_inspect_ranges_are_on_the_timeline(agent_runs):
    "The model-driven DVD run asked FrameInspect for 0:10–0:20: its lane has that span, its row lists it."
    from reveal_kit.eval.trace_view import trace_page
    _, runs = agent_runs
    t = _trace_files(runs['dvd-http'])[0]
    html = trace_page(runs['dvd-http'], t['qid'])
    assert 'FrameInspect asked for 0:10–0:20' in html and '<td>0:10–0:20</td>' in html
    assert 'search first' in html                                     # the agent's reasoning beside its call


def _copy_run(src: Path, dst: Path, qid_of) -> Path:
    "A copy of a run whose question ids are changed by `qid_of(i, qid)` (traces follow)."
    shutil.copytree(src, dst)
    rows = [json.loads(x) for x in (dst / 'results.jsonl').read_text().splitlines()]
    for i, r in enumerate(rows):
        p = dst / 'traces' / Path(r['trace']).name
        t = json.loads(p.read_text())
        r['qid'] = t['qid'] = qid_of(i, r['qid'])
        p.write_text(json.dumps(t))
        r['trace'] = str(p)
    (dst / 'results.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return dst


def test_integer_and_null_question_ids(agent_runs, tmp_path):
    "Odd but valid: qids 7, 8 and null give pages, and `trace show RUN 7` finds question 7."
    from reveal_kit.cli.share import trace_show
    _, runs = agent_runs
    run = _copy_run(runs['dvd'], tmp_path / 'odd', lambda i, q: [7, 8, None][i])
    s = write_run_browser(run, tmp_path / 'site' / 'run.html')
    assert s['questions'] == s['traces'] == 3
    r = _cli()(trace_show, run, '7', '--html', tmp_path / 'q7.html')
    assert r.exit_code == 0, r.output
    assert r.output.startswith('7 [dvd]') and 'Tool calls (' in (tmp_path / 'q7.html').read_text()


def test_question_pages_from_another_folder_keep_gold_lanes(tmp_path, monkeypatch):
    "A run made with a relative --root, its pages written from elsewhere: gold lanes, cues and question text kept."
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))
    monkeypatch.chdir(tmp_path)
    generate_benchmark(Path('bench'), minutes=1.0, videos=1, questions_per_video=2, size=(320, 180), progress=False)
    run_eval('synth', 'base', Path('made/run'), root=Path('bench'), progress=False)
    assert Path(json.loads(Path('made/run/run.json').read_text())['root']).is_absolute()
    (tmp_path / 'elsewhere').mkdir()
    monkeypatch.chdir(tmp_path / 'elsewhere')
    write_run_browser(tmp_path / 'made' / 'run', Path('site/run.html'), thumbs=True)
    page = Path('site/run_traces/00000.html').read_text()
    assert '<title>gold evidence' in page and 'cues: ' in page and '<p class="notice">' not in page
    row = Path('site/run.html').read_text()
    q0 = json.loads(Path(tmp_path / 'bench' / 'questions.jsonl').read_text().splitlines()[0])
    assert q0['question'].split()[0] in row


def test_a_page_says_what_it_cannot_find(agent_runs, tmp_path):
    "An older run whose relative root cannot be found from here: the page says so instead of dropping lanes."
    _, runs = agent_runs
    run = shutil.copytree(runs['dvd'], tmp_path / 'moved')
    meta = json.loads((run / 'run.json').read_text())
    (run / 'run.json').write_text(json.dumps(dict(meta, root='bench-that-moved')))
    write_run_browser(run, tmp_path / 'site' / 'run.html')
    page = (tmp_path / 'site' / 'run_traces' / '00000.html').read_text()
    assert '<p class="notice">the questions of benchmark synth under bench-that-moved cannot be loaded' in page


def test_compare_question_pages_show_both_runs(agent_runs, tmp_path):
    "`--compare`: each question page holds run A's trace, then run B's."
    _, runs = agent_runs
    s = write_run_browser(runs['dvd'], tmp_path / 'cmp.html', compare=runs['pace'])
    assert s['questions'] == 3
    for p in sorted((tmp_path / 'cmp_traces').glob('*.html')):
        html = p.read_text()
        assert html.index('Run A: dvd (dvd)') < html.index('Run B: pace (pace)')
        assert html.count('<div class="reveal-trace">') == 2 and 'QueryDecompose' in html


def test_bidi_overrides_are_stripped_from_pages(agent_runs, tmp_path):
    "A question or tool result with a right-to-left override shows as written, never reordered."
    _, runs = agent_runs
    run = _copy_run(runs['dvd'], tmp_path / 'bidi', lambda i, q: f"{q}\u202e")
    for p in (run / 'traces').glob('*.json'):
        t = json.loads(p.read_text())
        t['question'] = 'Which file is invoice\u202egpj.exe?'
        t['steps'][0]['summary'] = 'found \u2066it\u2069'
        p.write_text(json.dumps(t))
    write_run_browser(run, tmp_path / 'site' / 'run.html')
    for p in [tmp_path / 'site' / 'run.html', *(tmp_path / 'site' / 'run_traces').glob('*.html')]:
        html = p.read_text()
        assert not re.search('[\u202a-\u202e\u2066-\u2069]', html), p
    assert 'invoicegpj.exe' in (tmp_path / 'site' / 'run_traces' / '00000.html').read_text()


def test_pages_read_the_results_once(agent_runs, tmp_path, monkeypatch):
    "Writing the browser reads the results file a fixed number of times, not once per question (linear time)."
    import reveal_kit.eval.browser as B
    import reveal_kit.eval.trace_run as T
    _, runs = agent_runs
    run = _copy_run(runs['dvd'], tmp_path / 'big', lambda i, q: q)
    rows = [json.loads(x) for x in (run / 'results.jsonl').read_text().splitlines()]
    many = [dict(rows[i % len(rows)], qid=f"q{i:03d}") for i in range(60)]
    (run / 'results.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in many))
    reads = []
    real = T.load_results
    counting = lambda *a, **k: reads.append(1) or real(*a, **k)
    monkeypatch.setattr(T, 'load_results', counting)
    monkeypatch.setattr(B, 'load_results', counting)
    s = write_run_browser(run, tmp_path / 'site' / 'run.html')
    assert s['traces'] == 60 and len(reads) <= 3, len(reads)


@needs_chromium
def test_pace_and_dvd_trace_pages_in_chromium(agent_runs, tmp_path):
    "A PACE and a DVD trace page (model-driven runs) render in Chromium with their tool calls, and are screenshotted."
    from reveal_kit.eval.trace_view import trace_page
    _, runs = agent_runs
    for name in ('pace-http', 'dvd-http'):
        t = _trace_files(runs[name])[0]
        page = tmp_path / f'{name}.html'
        page.write_text(trace_page(runs[name], t['qid']))
        dom = chromium('--dump-dom', page.as_uri()).stdout
        assert 'Tool calls (' in dom and 'class="legend"' in dom and 'Evidence (' in dom, name
        assert all(s['tool'] in dom for s in t['steps'])
        shoot(page, tmp_path / f'{name}_trace_page.png', '1150,1500')
