"""Build the kit's site from its notebooks, offline: Sphinx with myst-nb and the furo theme.

    python tools/build_site.py [--out _site] [--jobs 2] [--no-exec]

Stages `nbs/` into `_docsrc/` (beside `nbs/`, so a notebook's relative paths mean the same), turns nbdev's cell
directives into myst-nb tags (`#| hide` and `#| default_exp` cells removed, `#| slow`/`#| gpu`/`#| vllm` cells shown but
not run), adds the committed figure(s) to each experiment notebook's page, writes the home page (the README), the
reading-order table of contents, the figures gallery and `llms.txt`, then runs `sphinx-build`, then checks the
result and fails on any problem (`check_site`: every notebook has a page, no page fetches from another host, each
runnable notebook was executed and its page shows the outputs that run made). `--check-only` checks a built site.
Component notebooks, tutorials and explanations are executed at build time and cached by jupyter-cache (`_site/.jupyter_cache`): a rebuild
re-executes only the notebooks that changed. Experiment notebooks are not executed (they rerun whole experiments);
their pages show the committed figures and CSVs. Nothing is fetched from the network at build or view time: no MathJax,
no widget JavaScript from a CDN, no web fonts.
"""
from __future__ import annotations
import argparse, json, re, shutil, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC, CONF = ROOT / '_docsrc', ROOT / 'docs'
DIRECTIVE = re.compile(r'^#\|\s*([\w-]+)(.*)$')
NO_RUN = {'gpu', 'vllm'}            # cells for hardware this machine may lack; slow cells run
GUIDES = sorted((CONF / 'guide').glob('*.md'), key=lambda p: ['notebooks', 'status', 'cli', 'gpu', 'scale',
                                                              'reference'].index(p.stem))
ROOMS = [('core', 'Core: types, settings, text and files'), ('testing', 'Testing fixtures'),
         ('backends', 'Backends: one chat interface'), ('retrieval', 'Retrieval: embedders and the index'),
         ('synth', 'The generated benchmark'), ('video', 'Video: frames, segments, subtitles, captions'),
         ('memory', "REVEAL's offline memory"), ('reveal', 'REVEAL: the agent'), ('pace', 'PACE and DVD'),
         ('eval', 'Evaluation, figures, sharing'), ('cli', 'The `reveal` command')]


def room_of(nb: Path) -> str:
    "`14a_memory.build.ipynb` → `memory`; `00_core.ipynb` → `core` (the top-level modules: text, io, record, … too)."
    room = nb.stem.split('_', 1)[-1].split('.')[0]
    return room if room in dict(ROOMS) else 'core'


def directives(src: str) -> tuple[set[str], str]:
    "The nbdev directives of a code cell and its source without them."
    found, keep = set(), []
    for line in src.splitlines():
        m = DIRECTIVE.match(line.strip())
        if m: found.add(m.group(1))
        else: keep.append(line)
    return found, '\n'.join(keep).strip('\n')


def exports(body: str) -> bool:
    "Whether a cell is nbdev's closing export cell (`nbdev.nbdev_export()`)."
    return 'nbdev_export' in body and len(body.splitlines()) <= 2


def stage_cell(cell: dict) -> dict | None:
    "One code cell as the site shows it: hidden cells removed, slow ones shown but not run, directives dropped."
    if cell['cell_type'] != 'code': return cell
    src = ''.join(cell['source']) if isinstance(cell['source'], list) else cell['source']
    found, body = directives(src)
    if exports(body): return None        # executed, it would rewrite the library from the staged copies
    tags = set(cell.get('metadata', {}).get('tags', []))
    if found & {'hide', 'default_exp'}: tags.add('remove-cell')
    if found & NO_RUN: tags.add('skip-execution')
    cell = dict(cell, source=body, metadata=dict(cell.get('metadata', {}), tags=sorted(tags)))
    return cell


def fig_id(nb: Path) -> str:
    "The name an experiment notebook gives its figures: its parameters cell's `fig_id`, else its own name."
    for c in json.loads(nb.read_text(encoding='utf-8'))['cells']:
        if 'parameters' in c['metadata'].get('tags', []):
            m = re.search(r"^fig_id\s*=\s*['\"]([^'\"]+)['\"]", ''.join(c['source']), re.M)
            if m: return m.group(1)
    return nb.stem


def figures_of(nb: Path) -> list[str]:
    "The committed figures an experiment notebook writes (`figures/<fig_id>*.png`)."
    return sorted(p.name for p in (ROOT / 'figures').glob(f'{fig_id(nb)}*.png'))


def figure_cell(nb: Path) -> dict:
    "A markdown cell showing the committed figure(s) of an experiment notebook."
    figs = figures_of(nb)
    body = '\n\n'.join(f'![{f}](../_static/figures/{f})' for f in figs) or '*(no committed figure)*'
    note = ('**The committed figure** (generated benchmark, offline roles: not a reproduction of the paper). '
            'This page shows the notebook without running it; `make figures` reruns it.')
    return {'cell_type': 'markdown', 'id': 'committed-figure', 'metadata': {}, 'source': f'{note}\n\n{body}'}


def stage_notebook(src: Path, dst: Path) -> None:
    "Copy one notebook into the staging tree with its cells prepared for the site."
    nb = json.loads(src.read_text(encoding='utf-8'))
    nb['cells'] = [c for c in map(stage_cell, nb['cells']) if c is not None and c['cell_type'] != 'raw']
    if src.parent.name == 'experiments': nb['cells'].insert(2, figure_cell(src))
    nb.setdefault('metadata', {})['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding='utf-8')


def title_of(nb: Path) -> tuple[str, str]:
    "A notebook's title (its first `# ` heading) and summary (its first `> ` line)."
    cells = json.loads(nb.read_text(encoding='utf-8'))['cells']
    text = '\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'markdown')
    title = next((l[2:].strip() for l in text.splitlines() if l.startswith('# ')), nb.stem)
    summary = next((l[1:].strip() for l in text.splitlines() if l.startswith('> ')), '')
    return title, summary


def notebooks() -> dict[str, list[Path]]:
    "The notebooks of the site by section, each in reading (file-name) order."
    nbs = ROOT / 'nbs'
    comp = sorted(p for p in nbs.glob('*.ipynb') if p.name != 'index.ipynb')
    out = {f'api-{r}': [p for p in comp if room_of(p) == r] for r, _ in ROOMS}
    for d in ('tutorials', 'explanations', 'experiments'): out[d] = sorted((nbs / d).glob('*.ipynb'))
    return out


def toctree(caption: str, docs: list[str], depth: int = 1) -> str:
    "A MyST toctree block."
    return f"```{{toctree}}\n:caption: {caption}\n:maxdepth: {depth}\n\n" + '\n'.join(docs) + '\n```\n'


def doc_name(nb: Path) -> str:
    "The page name of a notebook in the staging tree."
    rel = nb.relative_to(ROOT / 'nbs')
    return str(rel.with_suffix('')).replace('\\', '/')


def home_page(groups: dict) -> str:
    "The home page: the README, then the reading-order tables of contents (tutorials first)."
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    readme = re.sub(r'\]\(nbs/([^)]+)\.ipynb\)', r'](\1.ipynb)', readme)
    readme = re.sub(r'\]\(docs/([^)]+)\)', r'](\1)', readme)
    parts = [readme, '\n', toctree('Start here', [doc_name(p) for p in groups['tutorials']])]
    for r, caption in ROOMS:
        if groups[f'api-{r}']: parts.append(toctree(caption, [doc_name(p) for p in groups[f'api-{r}']]))
    parts += [toctree('Guides', [f'guide/{p.stem}' for p in GUIDES]),
              toctree('Explanations', [doc_name(p) for p in groups['explanations']] + ['references']),
              toctree('Experiments: every table and figure', ['gallery'] + [doc_name(p) for p in groups['experiments']])]
    return '\n'.join(parts)


def guide_page(text: str) -> str:
    "A guide of docs/guide/ as a site page: links to notebooks point at their pages, other repository files stay text."
    text = re.sub(r'\]\(\.\./\.\./nbs/([^)]+)\.ipynb\)', r'](../\1.ipynb)', text)
    return re.sub(r'\[([^\]]+)\]\(\.\./\.\./([^)]+)\)', r'\1 (`\2`)', text)


def gallery_page(exps: list[Path]) -> str:
    "Every committed figure with the paper table or figure it regenerates and the notebook that makes it."
    rows = ['# Figures gallery', '',
            'Every committed figure, with the paper element it regenerates and the notebook that makes it. All of them '
            'come from **the generated benchmark with offline roles — not a reproduction of the papers**: they show '
            'that each experiment runs end to end and what its table looks like; the numbers a paper reports need '
            'its benchmark and a real backbone (`nbs/experiments/params/*/paper.yaml`).', '']
    for nb in exps:
        title, summary = title_of(nb)
        rows += [f'## {title}', '', summary, '', f'Notebook: [{nb.name}](experiments/{nb.stem}.ipynb); data: '
                 + ', '.join(f'`figures/{c.name}`' for c in sorted((ROOT / 'figures').glob(f'{fig_id(nb)}*.csv'))), '']
        rows += [f'![{f}](_static/figures/{f})' for f in figures_of(nb)] + ['']
    return '\n'.join(rows)


def llms_txt(groups: dict, base: str = '') -> str:
    "An `llms.txt` index of the site's pages (https://llmstxt.org): title, link and summary of each."
    lines = ['# reveal-kit', '', '> ' + title_of(ROOT / 'nbs' / 'index.ipynb')[1], '']
    for key, items in groups.items():
        if not items: continue
        caption = dict(ROOMS).get(key[4:], key.capitalize()) if key.startswith('api-') else key.capitalize()
        lines += [f'## {caption}', '']
        for nb in items:
            title, summary = title_of(nb)
            lines.append(f'- [{title}]({base}{doc_name(nb)}.html): {summary}')
        lines.append('')
    lines += ['## Guides', ''] + [f"- [{g.read_text(encoding='utf-8').splitlines()[0][2:]}]({base}guide/{g.stem}.html)"
                                  for g in GUIDES]
    return '\n'.join(lines) + '\n'



def stage() -> dict:
    "Write the staging tree `_docsrc/`: notebooks, pages, figures, and the configuration's execution switch."
    if SRC.exists(): shutil.rmtree(SRC)
    groups = notebooks()
    for items in groups.values():
        for nb in items: stage_notebook(nb, SRC / nb.relative_to(ROOT / 'nbs'))
    (SRC / '_static' / 'figures').mkdir(parents=True)
    for f in (ROOT / 'figures').glob('*.png'): shutil.copy2(f, SRC / '_static' / 'figures' / f.name)
    (SRC / 'index.md').write_text(home_page(groups), encoding='utf-8')
    (SRC / 'gallery.md').write_text(gallery_page(groups['experiments']), encoding='utf-8')
    shutil.copy2(CONF / 'references.md', SRC / 'references.md')
    (SRC / 'guide').mkdir()
    for g in GUIDES: (SRC / 'guide' / g.name).write_text(guide_page(g.read_text(encoding='utf-8')), encoding='utf-8')
    return groups


def execute_all(groups: dict, cache_path: Path) -> None:
    "Run every staged notebook but the experiments through jupyter-cache (in parallel); only changed ones rerun."
    from jupyter_cache import get_cache
    from jupyter_cache.executors import load_executor
    cache = get_cache(str(cache_path))
    for key, items in groups.items():
        if key == 'experiments': continue
        for nb in items: cache.add_nb_to_project(str(SRC / nb.relative_to(ROOT / 'nbs')))
    res = load_executor('local-parallel', cache).run_and_cache(timeout=900)
    bad = res.errored + res.excepted
    if bad:   # a notebook that starts services (Ray) can time out beside others on a loaded machine: once more, alone
        print(f"site: rerunning {len(bad)} notebook(s) one at a time: {', '.join(Path(u).name for u in bad)}",
              file=sys.stderr)
        res = load_executor('local-serial', cache).run_and_cache(filter_uris=bad, timeout=900)
        bad = res.errored + res.excepted
    for uri in bad:
        rec = cache.get_project_record(uri)
        print(f"\n--- {uri} failed:\n{(rec.traceback or '')[-3000:]}", file=sys.stderr)
    if bad: raise SystemExit(f"site: {len(bad)} notebook(s) failed to run: {', '.join(Path(u).name for u in bad)}")


def build(out: Path, jobs: int = 2, execute: bool = True) -> float:
    "Stage and build the site into `out`; the seconds it took."
    t0 = time.time()
    groups = stage()
    if execute: execute_all(groups, out / '.jupyter_cache')
    cmd = [sys.executable, '-m', 'sphinx', '-b', 'html', '-q', '-j', str(jobs), '-c', str(CONF), str(SRC), str(out),
           '-D', f'nb_execution_mode={"cache" if execute else "off"}',
           '-D', f'nb_execution_cache_path={out / ".jupyter_cache"}']
    subprocess.run(cmd, check=True, cwd=ROOT)
    (out / 'llms.txt').write_text(llms_txt(groups), encoding='utf-8')
    return time.time() - t0


FETCH = re.compile(r"""<(script|link|img|iframe|source|video)[^>]+(src|href)=["']?(https?:)?//""")
OUTPUT = 'class="cell_output'


def shown_and_run(cell: dict) -> bool:
    "Whether the site shows a code cell and runs it at build time."
    staged = stage_cell(cell) if cell['cell_type'] == 'code' else None
    return bool(staged and staged['source']) and not {'remove-cell', 'skip-execution'} & set(staged['metadata']['tags'])


def shows_outputs(nb: Path) -> bool:
    "Whether a notebook's page should carry executed outputs: not an experiment (those are not run), a cell run."
    if nb.parent.name == 'experiments': return False
    return any(map(shown_and_run, json.loads(nb.read_text(encoding='utf-8'))['cells']))


def cached_outputs(out: Path, nb: Path) -> int | None:
    "How many outputs the shown cells of a notebook's cached execution hold; None if it was never executed."
    import nbformat
    from jupyter_cache import get_cache
    staged = SRC / nb.relative_to(ROOT / 'nbs')
    try: rec = get_cache(str(out / '.jupyter_cache')).match_cache_notebook(nbformat.read(staged, 4))
    except (KeyError, OSError): return None
    cells = get_cache(str(out / '.jupyter_cache')).get_cache_bundle(rec.pk).nb.cells
    shown = [c for c in cells if c.cell_type == 'code' and 'remove-cell' not in c.metadata.get('tags', [])]
    return sum(len(c.get('outputs', [])) for c in shown)


def page_problems(out: Path, nb: Path, executed: bool) -> list[str]:
    "What is wrong with one notebook's page: missing, or (executed) never run or without the outputs its run made."
    page, name = out / f'{doc_name(nb)}.html', doc_name(nb)
    if not page.is_file(): return [f'{name}: no page']
    if not (executed and shows_outputs(nb)): return []
    n = cached_outputs(out, nb)
    if n is None: return [f'{name}: not executed']
    return [f'{name}: no executed output'] if n and OUTPUT not in page.read_text(encoding='utf-8') else []


def check_site(out: Path, executed: bool = True) -> list[str]:
    "What is wrong with a built site: a notebook without a page, a page fetching from elsewhere, outputs missing."
    problems = [p for items in notebooks().values() for nb in items for p in page_problems(out, nb, executed)]
    for page in out.rglob('*.html'):
        if FETCH.search(page.read_text(encoding='utf-8')):
            problems.append(f'{page.relative_to(out)}: fetches from another host')
    if not (out / 'index.html').is_file(): problems.append('no index.html')
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--out', default='_site', help='folder of the built site (default _site)')
    ap.add_argument('--jobs', type=int, default=2, help='parallel Sphinx readers (each executes notebooks)')
    ap.add_argument('--no-exec', action='store_true', help='render notebooks as committed, without running them')
    ap.add_argument('--check-only', action='store_true', help='check the site already built in --out, build nothing')
    a = ap.parse_args(argv)
    out = (ROOT / a.out).resolve()
    secs = 0.0 if a.check_only else build(out, a.jobs, not a.no_exec)
    bad = check_site(out, executed=not a.no_exec)
    if bad: raise SystemExit(f"site: {len(bad)} problem(s):\n  " + '\n  '.join(bad))
    size = sum(p.stat().st_size for p in out.rglob('*') if p.is_file() and '.jupyter_cache' not in p.parts)
    print(f"site: {out}/index.html — {len(list(out.rglob('*.html')))} pages, {size / 2**20:.1f} MiB, built in {secs:.0f} s")


if __name__ == '__main__':
    main()
