"""The run browser and the trace timeline in a real browser: headless Chromium renders a run page (two runs compared)
and a trace page, its script runs (the filter count is filled in), and each is screenshotted. Skipped, saying why,
only where Debian's `chromium` is not installed (`apt-get install -y chromium`)."""
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
