"""The rendered site of the notebooks (`make docs`, tools/build_site.py) and JupyterLab (`make lab`), looked at as a
reader would: headless Chromium renders three site pages with no network and screenshots them, and opens the run viewer
in a JupyterLab started on 127.0.0.1. Skipped, saying why, only where Debian's `chromium` is not installed (CI
installs it and never skips)."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not os.environ.get('CI'),
                                    reason="headless Chromium is not installed (Debian: apt-get install -y chromium)")
SHOTS = Path(os.environ['REVEAL_SCREENSHOTS']) if os.environ.get('REVEAL_SCREENSHOTS') else None


def chromium(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    "Headless Chromium with no network beyond 127.0.0.1 and a throwaway profile."
    return subprocess.run([CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars',
                           '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1', *args],
                          capture_output=True, text=True, timeout=timeout)


def shoot(url: str, png: Path, size: str = '1280,1400', wait_ms: int = 0) -> Path:
    "A screenshot of a page (kept in $REVEAL_SCREENSHOTS too, when set, for a person to look at)."
    extra = [f'--virtual-time-budget={wait_ms}'] if wait_ms else []
    r = chromium(f'--window-size={size}', f'--screenshot={png}', *extra, url)
    assert png.is_file() and png.stat().st_size > 10_000, r.stderr[-2000:]
    if SHOTS:
        SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(png, SHOTS / png.name)
    return png


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    "The site built from the notebooks as committed (no execution: `make docs` adds the executed outputs)."
    out = tmp_path_factory.mktemp('site') / 'site'
    r = subprocess.run([sys.executable, 'tools/build_site.py', '--out', str(out), '--no-exec'], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'pages' in r.stdout
    return out


def test_every_notebook_has_a_page_in_reading_order(site):
    "Each notebook of nbs/ is a page; the home page's sidebar lists the component notebooks in file order."
    nbs = sorted(p for p in (ROOT / 'nbs').glob('*.ipynb') if p.name != 'index.ipynb')
    for nb in nbs + sorted((ROOT / 'nbs').glob('*/*.ipynb')):
        rel = nb.relative_to(ROOT / 'nbs').with_suffix('.html')
        assert (site / rel).is_file(), rel
    home = (site / 'index.html').read_text()
    pos = [home.find(f'href="{p.stem}.html"') for p in nbs]
    assert -1 not in pos and pos == sorted(pos)
    assert 'href="gallery.html"' in home and 'href="references.html"' in home


def test_pages_fetch_nothing_and_hide_nbdev_directives(site):
    "No page loads a script, style, font or image from another host; nbdev's `#| ...` lines never show."
    for page in site.rglob('*.html'):
        html = page.read_text()
        assert not re.search(r"""<(script|link|img|iframe)[^>]+(src|href)=["']?(https?:)?//""", html), page
        assert '#| export' not in html and '#| hide' not in html, page
    assert (site / 'searchindex.js').is_file()


def test_gallery_maps_each_committed_figure_to_its_notebook(site):
    "Every committed figure is in the gallery, beside the notebook that makes it; each says it is no reproduction."
    gallery = (site / 'gallery.html').read_text()
    for png in (ROOT / 'figures').glob('*.png'):
        assert png.name in gallery, png.name
    assert gallery.count('not a reproduction') >= 1
    assert 'experiments/reveal_table2.html' in gallery


def load_builder():
    "tools/build_site.py as a module."
    import importlib.util
    spec = importlib.util.spec_from_file_location('build_site', ROOT / 'tools' / 'build_site.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_check_site_finds_what_is_broken(site, tmp_path):
    "`check_site` (run by every build) passes the built site and names a missing page, a fetch, a page never run."
    bs = load_builder()
    assert bs.check_site(site, executed=False) == []
    bad = tmp_path / 'bad'
    shutil.copytree(site, bad, ignore=shutil.ignore_patterns('.jupyter_cache'))
    (bad / '22_reveal.planner.html').unlink()
    page = bad / 'gallery.html'
    page.write_text(page.read_text().replace('</head>', '<script src="https://cdn.example/x.js"></script></head>'))
    got = bs.check_site(bad, executed=True)
    assert '22_reveal.planner: no page' in got and 'gallery.html: fetches from another host' in got, got
    assert '25b_reveal.agent: not executed' in got                       # built with --no-exec: nothing ran
    assert not any(p.startswith('experiments/') and 'output' in p for p in got)   # experiments are never run


def test_staged_notebooks_do_not_export(tmp_path):
    "The staged copy keeps no `nbdev_export()` cell (run at build time it would rewrite the library); hidden cells run."
    bs, src = load_builder(), ROOT / 'nbs' / '42b_eval.methods.ipynb'
    bs.stage_notebook(src, tmp_path / src.name)
    code = [c for c in json.loads((tmp_path / src.name).read_text())['cells'] if c['cell_type'] == 'code']
    assert any('nbdev_export' in ''.join(c['source']) for c in json.loads(src.read_text())['cells'])
    assert code and not any('nbdev_export' in c['source'] for c in code)


def test_ci_builds_and_checks_the_executed_site():
    "CI (`.ci/run`) builds the executed site with `make docs` (which checks it) after the tests."
    run = (ROOT / '.ci' / 'run').read_text()
    assert re.search(r'^make test$', run, re.M) and re.search(r'^make docs$', run, re.M)
    assert run.index('\nmake test\n') < run.index('\nmake docs\n')
    make = (ROOT / 'Makefile').read_text()
    assert re.search(r'^docs:.*\n\t\$\(PY\) tools/build_site.py --out _site$', make, re.M)


def test_llms_txt_lists_every_page(site):
    "`llms.txt` names each notebook's page with its title and summary."
    llms = (site / 'llms.txt').read_text()
    assert llms.startswith('# reveal-kit')
    assert '(25b_reveal.agent.html): Retrieve' in llms
    assert len(re.findall(r'^- \[', llms, re.M)) == len(list(site.rglob('*.html'))) - 5   # index, gallery, refs, search, genindex


@needs_chromium
def test_three_pages_in_chromium(site, tmp_path):
    "The home page, a component notebook and the gallery render offline; their DOM holds the expected content."
    for page, text in [('index.html', 'long-video question answering'), ('25b_reveal.agent.html', 'The REVEAL agent loop'),
                       ('gallery.html', 'Figures gallery')]:
        dom = chromium('--dump-dom', (site / page).as_uri()).stdout
        assert text in dom, page
        shoot((site / page).as_uri(), tmp_path / f"site_{page.replace('.html', '.png')}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def lab(tmp_path_factory):
    "JupyterLab on 127.0.0.1 over a folder holding the onboarding notebook and an executed run-viewer notebook."
    d = tmp_path_factory.mktemp('lab')
    shutil.copy(ROOT / 'nbs' / 'tutorials' / 'onboarding.ipynb', d / 'onboarding.ipynb')
    viewer_notebook(d)
    port, token = free_port(), 'reveal-kit-test'
    proc = subprocess.Popen([sys.executable, '-m', 'jupyterlab', '--ip', '127.0.0.1', '--port', str(port),
                             '--no-browser', f'--ServerApp.root_dir={d}', f'--IdentityProvider.token={token}',
                             '--ServerApp.open_browser=False', *(['--allow-root'] if os.geteuid() == 0 else [])], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=dict(os.environ, JUPYTER_CONFIG_DIR=str(d / '.jupyter')))
    base = f'http://127.0.0.1:{port}'
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f'{base}/api/status?token={token}', timeout=2)
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail('JupyterLab did not start within 120 s')
    yield base, token, d
    proc.terminate()
    proc.wait(timeout=30)


def viewer_notebook(d: Path) -> Path:
    "A notebook that opens the run viewer over a tiny run, executed with its widget state saved (as JupyterLab does)."
    import nbformat
    from nbformat.sign import NotebookNotary
    from nbclient import NotebookClient
    from reveal_kit.eval.methods import register_method
    from reveal_kit.eval.runner import run_eval
    from reveal_kit.testing.runs import first_letter, toy_questions
    run = d / 'run'
    register_method('_first_letter')(first_letter)
    run_eval(toy_questions(3), '_first_letter', run, progress=False)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"from reveal_kit.eval.trace_view import TraceViewer\nTraceViewer({str(run)!r})")])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    NotebookClient(nb, timeout=300, kernel_name='python3', store_widget_state=True).execute()
    NotebookNotary().sign(nb)            # trusted, as a notebook its author ran: widgets render
    nbformat.write(nb, d / 'viewer.ipynb')
    return d / 'viewer.ipynb'


def test_jupyterlab_is_installed_and_listens_on_loopback(lab):
    "`jupyter lab` runs from the dev install and serves the notebooks' folder."
    base, token, d = lab
    items = json.load(urllib.request.urlopen(f'{base}/api/contents?token={token}', timeout=10))['content']
    assert {'onboarding.ipynb', 'viewer.ipynb'} <= {i['name'] for i in items}


def page_text_when(url: str, selector: str, wait_s: float = 90) -> list[str]:
    """The text of the elements matching `selector` once the page shows some (a live headless Chromium, polled
    through the DevTools protocol), or [] after `wait_s`."""
    import tempfile
    import websocket                                    # websocket-client, a dependency of jupyter_server
    prof = Path(tempfile.mkdtemp())
    proc = subprocess.Popen([CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--window-size=1280,1400',
                             '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1', f'--user-data-dir={prof}',
                             '--remote-debugging-port=0', url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + wait_s
        while not (prof / 'DevToolsActivePort').is_file() and time.time() < deadline: time.sleep(0.5)
        port = (prof / 'DevToolsActivePort').read_text().split()[0]
        pages = json.load(urllib.request.urlopen(f'http://127.0.0.1:{port}/json', timeout=10))
        ws = websocket.create_connection(next(p for p in pages if p['type'] == 'page')['webSocketDebuggerUrl'])
        js = f"Array.from(document.querySelectorAll({selector!r})).map(e => e.textContent)"
        while time.time() < deadline:
            ws.send(json.dumps({'id': 1, 'method': 'Runtime.evaluate',
                                'params': {'expression': js, 'returnByValue': True}}))
            found = json.loads(ws.recv())['result']['result'].get('value') or []
            if found: return found
            time.sleep(1)
        return []
    finally:
        proc.kill()
        shutil.rmtree(prof, ignore_errors=True)


@needs_chromium
def test_onboarding_and_run_viewer_open_in_jupyterlab(lab, tmp_path):
    """Headless Chromium opens the onboarding notebook and the run viewer in JupyterLab; the viewer's widgets render
    from their saved state with no network (the widget extension ships with JupyterLab)."""
    base, token, _ = lab
    url = f'{base}/lab/tree/onboarding.ipynb?token={token}'
    assert any('Onboarding: one question through REVEAL' in t for t in page_text_when(url, '.jp-RenderedMarkdown h1'))
    shoot(url, tmp_path / 'lab_onboarding.png', wait_ms=30000)
    url = f'{base}/lab/tree/viewer.ipynb?token={token}'
    options = page_text_when(url, '.jupyter-widgets select option')
    assert any('q0' in o for o in options) and any('q2' in o for o in options), options
    shoot(url, tmp_path / 'lab_viewer.png', wait_ms=40000)
