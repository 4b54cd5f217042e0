"""The experiment notebooks run through papermill with tiny parameters; each test asserts on the CSVs it wrote."""
import ast
import csv
import json
import os
from dataclasses import fields
from pathlib import Path
import papermill as pm
import pytest
import yaml
from reveal_kit.eval.metrics import load_results
from reveal_kit.eval.figures.common import ensure_synth
from reveal_kit.eval.figures.experiment import Experiment

NB = Path(__file__).resolve().parents[1] / 'nbs' / 'experiments'
TINY = dict(synth={'minutes': 1.0, 'videos': 1, 'questions_per_video': 2}, seed=0)


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    "One folder for the whole module: the generated benchmark, memories and runs are shared by the notebooks."
    d = tmp_path_factory.mktemp('experiments')
    old = os.environ.get('REVEAL_RUNS')
    os.environ['REVEAL_RUNS'] = str(d / 'runs')
    yield d
    if old is None: os.environ.pop('REVEAL_RUNS', None)
    else: os.environ['REVEAL_RUNS'] = old


def run_nb(name: str, work: Path, tag: str = '', setup: dict | None = None, **params) -> Path:
    "Execute nbs/experiments/<name>.ipynb with tiny parameters (and `setup`); returns the folder its figures went to."
    figs = work / f'figs{tag}'
    (work / 'executed').mkdir(exist_ok=True)
    s = {**TINY, 'root': str(work / 'bench'), 'out_dir': str(work / f'out{tag}'), 'fig_dir': str(figs), **(setup or {})}
    pm.execute_notebook(str(NB / f'{name}.ipynb'), str(work / 'executed' / f'{name}{tag}.ipynb'),
                        parameters={**params, 'setup': s}, kernel_name='python3', progress_bar=False, cwd=str(NB))
    return figs


def parameters_cell(name: str) -> dict:
    "The literals of a notebook's one `parameters`-tagged cell, by name."
    cells = [c for c in json.loads((NB / f'{name}.ipynb').read_text())['cells']
             if 'parameters' in c['metadata'].get('tags', [])]
    assert len(cells) == 1, name
    body = ast.parse(''.join(cells[0]['source'])).body
    assert all(isinstance(st, ast.Assign) and len(st.targets) == 1 for st in body), name
    return {st.targets[0].id: ast.literal_eval(st.value) for st in body}


FIG_IDS = {'pace_main_tables': 'pace_table4'}     # a renamed notebook keeps its figure files' names


def test_parameters_cells():
    "Each notebook: one tagged cell of literals, `setup` empty (the defaults are Experiment's), no function defined."
    for nb in sorted(NB.glob('*.ipynb')):
        p = parameters_cell(nb.stem)
        assert p['setup'] == {} and {'benchmark', 'limit', 'fig_id'} <= set(p) and p['fig_id'] == FIG_IDS.get(nb.stem, nb.stem), nb.stem
        assert not set(p) & {f.name for f in fields(Experiment)} - {'benchmark', 'limit'}, nb.stem
        code = [''.join(c['source']) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code']
        defs = [n for c in code for n in ast.walk(ast.parse(c)) if isinstance(n, (ast.FunctionDef, ast.Lambda))]
        assert not defs, nb.stem


def test_paper_params_match():
    "Every params/<notebook>/paper*.yaml sets only its notebook's parameters, and under `setup` Experiment's fields."
    known = {f.name for f in fields(Experiment)}
    ymls = sorted(NB.glob('params/*/paper*.yaml'))
    assert len({y.parent.name for y in ymls}) == len(list(NB.glob('*.ipynb')))
    for y in ymls:
        p, names = yaml.safe_load(y.read_text()), set(parameters_cell(y.parent.name))
        assert set(p) <= names and set(p['setup']) <= known, (y, set(p) - names, set(p['setup']) - known)
        assert {'root', 'split', 'backend', 'base_url', 'model'} <= set(p['setup']), y


def test_unknown_setup_key(work):
    "A misspelt setup key stops the notebook at once, naming the key and the nearest field."
    with pytest.raises(pm.PapermillExecutionError) as e:
        run_nb('reveal_table1', work, tag='-typo', methods=['blind'], setup={'cache_mod': 'off'})
    assert "unknown setup key 'cache_mod' (did you mean 'cache_mode'?)" in str(e.value)
    assert not (work / 'figs-typo').exists()


def rows(path: Path) -> list[dict]:
    with open(path, newline='') as f: return list(csv.DictReader(f))


def in_unit(x: str) -> bool:
    return x == '' or 0.0 <= float(x) <= 1.0


def test_table1(work):
    figs = run_nb('reveal_table1', work, methods=['direct', 'base', 'reveal'])
    t = rows(figs / 'reveal_table1.csv')
    assert [r['method'] for r in t] == ['direct', 'base', 'reveal']
    assert set(t[0]) == {'method', 'n', 'correct', 'failed', 'accuracy', 'ci_low', 'ci_high'}
    for r in t:
        assert int(r['n']) == 2 and int(r['failed']) == 0
        assert float(r['ci_low']) <= float(r['accuracy']) <= float(r['ci_high']) and in_unit(r['accuracy'])
    assert (figs / 'reveal_table1.png').stat().st_size > 10_000
    assert (work / 'out' / 'reveal_table1.metrics.json').exists()


def test_table2(work):
    methods = ['base', '+iter', '+offmem', '+onmem', 'reveal', 'rerank_only', 'verify_only']   # two earlier spellings
    figs = run_nb('reveal_table2', work, methods=methods, n_boot=200)
    assert [r['method'] for r in rows(figs / 'reveal_table2.csv')] == [m.replace('_', '-') for m in methods]
    steps = rows(figs / 'reveal_table2_steps.csv')
    assert [(r['before'], r['after']) for r in steps][:4] == [('base', '+iter'), ('+iter', '+offmem'),
                                                             ('+offmem', '+onmem'), ('+onmem', 'reveal')]
    assert len(steps) == 8
    for r in steps:
        assert 0 < float(r['mcnemar_p']) <= 1
        assert float(r['diff_ci_low']) <= float(r['diff']) <= float(r['diff_ci_high'])
    grid = rows(figs / 'reveal_table2_two_by_two.csv')
    assert [g['rubric rerank'] for g in grid] == ['no', 'yes'] and all(in_unit(g['yes']) for g in grid)


def test_fig4a(work):
    figs = run_nb('reveal_fig4a', work, caps=[1, 4])
    t = rows(figs / 'reveal_fig4a.csv')
    assert [(r['arm'], r['cap']) for r in t] == [('fixed', '1'), ('fixed', '4'), ('reveal', '')]
    assert float(t[0]['segments']) <= float(t[1]['segments'])          # a larger cap admits at least as much
    assert all(in_unit(r['accuracy']) for r in t)
    assert all(in_unit(r['cut_share']) and in_unit(r['rerank_fallback']) for r in t)   # what bent each point


def test_fig4b(work):
    figs = run_nb('reveal_fig4b', work)
    t = rows(figs / 'reveal_fig4b.csv')
    assert {r['arm'] for r in t} >= {'REVEAL (retrieved evidence)'}
    assert [r['verdict'] for r in t][:2] == ['sufficient', 'insufficient']
    plain = [r for r in t if r['arm'] == 'REVEAL (retrieved evidence)']
    assert sum(int(r['n']) for r in plain) <= 2 and all(in_unit(r['accuracy']) for r in t)
    frames = [r for r in t if r['arm'] == 'oracle captions + frames']
    assert frames and all(r['answerer frames'].startswith('0 (answerer cannot take images') for r in frames)


def test_fig4c(work):
    figs = run_nb('reveal_fig4c', work)
    t = rows(figs / 'reveal_fig4c.csv')
    assert t[-1]['qtype'] == 'all' and int(t[-1]['n']) == 2
    assert [r['qtype'] for r in t[:-1]] == sorted(r['qtype'] for r in t[:-1])
    for r in t: assert abs(float(r['acc_after']) - float(r['acc_before']) - float(r['diff'])) < 1e-3


def test_tables34(work):
    figs = run_nb('reveal_tables34', work)
    cost = rows(figs / 'reveal_tables34.csv')
    assert [r['method'] for r in cost] == ['base', 'reveal']
    assert all(float(r['rounds_mean']) >= 1 for r in cost)
    assert not any('seconds' in k for k in cost[0])         # wall times change per run: they have their own CSV
    assert all(float(r['llm_calls_no_rerank_mean']) <= float(r['llm_calls_mean']) for r in cost)   # Table 4: 2R+2
    timing = rows(figs / 'reveal_tables34_timing.csv')
    assert [(r['method'], r['part']) for r in timing] == [('base', 'per question'), ('reveal', 'per question'),
                                                          ('memory build', 'shared, once per video and chunking')]
    assert all(float(r['seconds_total']) > 0 and int(r['n']) == 2 for r in timing[:2])
    assert int(timing[2]['n']) == 2 and float(timing[2]['seconds_total']) > 0      # fixed + adaptive, apart
    hist = rows(figs / 'reveal_tables34_rounds.csv')
    assert [(r['method'], r['rounds']) for r in hist] == [(m, str(k)) for m in ('base', 'reveal') for k in (1, 2, 3)]
    assert all(sum(int(r['questions']) for r in hist if r['method'] == m) == 2 for m in ('base', 'reveal'))


def test_replay_miss_fails_loudly(work):
    "Replay with an empty cache: the first model call fails, naming the role and the cache."
    with pytest.raises(pm.PapermillExecutionError) as e:
        run_nb('reveal_table1', work, tag='-miss', methods=['blind'],
               setup=dict(roles='model', cache_mode='replay', cache=str(work / 'empty.sqlite')))
    assert 'CacheMiss' in str(e.value) and 'empty.sqlite' in str(e.value)


@pytest.mark.slow
def test_replay_reproduces_csv(work):
    "The embedded model really called in-process (roles='model'), then replayed from its cache: the same CSV bytes."
    kw = dict(roles='model', cache=str(work / 'calls.sqlite'))
    first = run_nb('reveal_table1', work, tag='-rw', methods=['blind'], setup=dict(cache_mode='readwrite', **kw))
    again = run_nb('reveal_table1', work, tag='-replay', methods=['blind'], setup=dict(cache_mode='replay', **kw))
    a, b = (first / 'reveal_table1.csv').read_bytes(), (again / 'reveal_table1.csv').read_bytes()
    assert a == b and b'blind' in a
    res = load_results(next((work / 'out-replay').glob('*/blind-*')))
    assert len(res) == 2 and all(r['llm_calls'] == 1 for r in res)     # each answer: one model call, replayed


@pytest.mark.slow
def test_tables34_replay_identical(work):
    "Tables 3–4 with the embedded model called in-process, then replayed: every CSV but the timing one, same bytes."
    kw = dict(roles='model', cache=str(work / 'calls34.sqlite'))
    first = run_nb('reveal_tables34', work, tag='-rw34', methods=['blind'], setup=dict(cache_mode='readwrite', **kw))
    again = run_nb('reveal_tables34', work, tag='-replay34', methods=['blind'], setup=dict(cache_mode='replay', **kw))
    for name in ('reveal_tables34.csv', 'reveal_tables34_rounds.csv', 'reveal_tables34_calls.csv'):
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    assert rows(first / 'reveal_tables34.csv')[0]['llm_calls_total'] == '2'       # one real call per question
    assert (again / 'reveal_tables34_timing.csv').exists()


def test_only_present(work):
    "With only_present, a question whose video is missing is left out of the table instead of failing."
    bench = ensure_synth(work / 'bench-gone', minutes=1.0, videos=2, questions_per_video=2)
    gone = sorted((bench / 'videos').glob('*.mp4'))[0]
    gone.rename(gone.with_suffix('.gone'))
    figs = run_nb('reveal_table1', work, tag='-present', methods=['blind'],
                  setup=dict(root=str(bench), only_present=True))
    assert rows(figs / 'reveal_table1.csv')[0]['n'] == '2'                   # the other video's two questions


PACE_METHODS = ['direct', 'reveal', 'dvd', 'pace', 'pace-no-qcindex', 'pace-no-verify']


def test_pace_main_tables(work):
    figs = run_nb('pace_main_tables', work, methods=PACE_METHODS, n_boot=200)
    acc = rows(figs / 'pace_table4.csv')
    assert [r['method'] for r in acc] == PACE_METHODS
    for r in acc:
        assert int(r['n']) == 2 and int(r['failed']) == 0
        assert float(r['ci_low']) <= float(r['accuracy']) <= float(r['ci_high'])
    vs = rows(figs / 'pace_table4_versus.csv')
    assert [(r['before'], r['after']) for r in vs] == [('pace', m) for m in PACE_METHODS if m != 'pace']
    assert all(0 < float(r['mcnemar_p']) <= 1 for r in vs)
    cost = {r['method']: r for r in rows(figs / 'pace_table4_cost.csv')}
    assert all(1 <= float(cost[m]['rounds_mean']) <= 15 for m in ('dvd', 'pace', 'pace-no-qcindex', 'pace-no-verify'))


def test_pace_needle(work):
    methods = ['direct', 'dvd', 'reveal', 'pace']
    figs = run_nb('pace_needle', work, methods=methods, n_boot=200)
    t = rows(figs / 'pace_needle.csv')
    assert [r['method'] for r in t] == methods
    for r in t:
        assert int(r['n']) == 2 and in_unit(r['needle_recall']) and in_unit(r['accuracy'])
        assert float(r['recall_ci_low']) <= float(r['needle_recall']) <= float(r['recall_ci_high'])


def test_pace_table6(work):
    figs = run_nb('pace_table6', work)
    tok = rows(figs / 'pace_table6.csv')
    stages = ('indexing (per clip)', 'indexing: shared plain pass (per clip)', 'indexing: per-question pass (per clip)',
              'reasoning (per query)')                      # Table 6 with the two indexing passes apart
    assert [(r['method'], r['stage']) for r in tok] == [(m, s) for m in ('dvd', 'pace') for s in stages]
    assert all(float(r['prompt_tokens']) >= 0 for r in tok) and int(tok[0]['n']) > 0      # clips indexed
    tools = rows(figs / 'pace_table6_tools.csv')
    pace = {r['tool']: r for r in tools if r['method'] == 'pace'}
    assert 'GlobalBrowse' in pace and all(in_unit(r['episodes_using']) for r in tools)
    assert not {'QueryDecompose', 'EvidenceRetrieve'} & {r['tool'] for r in tools if r['method'] == 'dvd'}


def test_pace_needle_with_a_judge_model(work):
    "A judge model named by `judge` (a server): every row's recall is the judge's, and the table names it."
    from reveal_kit.testing.fakes import FakeChatServer
    with FakeChatServer(lambda p: json.dumps({'found': True, 'why': 'seen'}), model='fake-judge') as srv:
        figs = run_nb('pace_needle', work, tag='-judge', methods=['dvd', 'pace'], n_boot=200,
                      judge=f"{srv.url},fake-judge", setup={'cache_mode': 'off'})
    t = rows(figs / 'pace_needle.csv')
    assert [(r['method'], r['judge'], float(r['needle_recall'])) for r in t] == [('dvd', 'model:fake-judge', 1.0),
                                                                                ('pace', 'model:fake-judge', 1.0)]


def test_pace_table3(work):
    "Two backbone setups (here both the offline roles): each gives DVD's and PACE's accuracy and the delta."
    figs = run_nb('pace_table3', work, backbones={'unified': {}, 'uncached': {'cache_mode': 'off'}})
    t = rows(figs / 'pace_table3.csv')
    assert [r['backbone'] for r in t] == ['unified', 'uncached'] and all(int(r['n']) == 2 for r in t)
    assert all(abs(float(r['delta']) - (float(r['pace_accuracy']) - float(r['dvd_accuracy']))) < 1e-9 for r in t)


def test_pace_table5(work):
    figs = run_nb('pace_table5', work)
    t = rows(figs / 'pace_table5.csv')
    assert [r['tool'] for r in t] == ['EvidenceRetrieve', 'ClipSearch']
    assert int(t[0]['samples']) == 2 and int(t[1]['samples']) == 0       # the offline policy: ER always, ClipSearch never
    assert in_unit(t[0]['with_tool']) and in_unit(t[0]['without_tool'])
    assert float(t[0]['calls_per_episode']) >= 1 and float(t[1]['calls_per_episode']) == 0   # what was ablated


@pytest.mark.slow
def test_pace_appg_clips(work):
    figs = run_nb('pace_appg_clips', work, clip_seconds=[5, 20])
    t = rows(figs / 'pace_appg_clips.csv')
    assert [(r['clip_s'], r['method']) for r in t] == [('5.0', 'pace'), ('20.0', 'pace')]
    assert all(int(r['n']) == 2 and in_unit(r['accuracy']) for r in t)


@pytest.mark.slow
def test_pace_fig4_factors(work):
    figs = run_nb('pace_fig4_factors', work, budgets=[1, 5], references=['pace-no-verify'])
    t = rows(figs / 'pace_fig4_factors.csv')
    assert [(r['arm'], r['k']) for r in t] == [('forced', '1'), ('forced', '5'), ('pace-no-verify', '')]
    assert all(in_unit(r['accuracy']) and int(r['n']) == 2 for r in t)
    assert all(float(r['factors']) <= int(r['k']) for r in t[:2]) and float(t[0]['factors']) == 1.0


@pytest.mark.slow
def test_induction(work):
    "Induce the experiment's pool on a generated dev split, compare seed vs induced pool on the test split."
    recipe = dict(path=str(work / 'pools' / 'induced-tiny.yaml'), benchmark='synth', root=str(work / 'dev'), split='dev',
                  synth={'minutes': 2.0, 'videos': 2, 'questions_per_video': 12}, max_iters=2)
    figs = run_nb('reveal_induction', work, n_boot=200, setup={'rubric_pool': recipe})
    pools = rows(figs / 'reveal_induction.csv')
    assert [r['method'] for r in pools] == ['seed pool', 'induced pool'] and all(int(r['n']) == 2 for r in pools)
    curve = rows(figs / 'reveal_induction_curve.csv')
    assert curve[0]['iteration'] == '0' and sum(r['best'] == 'True' for r in curve) == 1
    flt = rows(figs / 'reveal_induction_filters.csv')
    assert [r['condition'] for r in flt][-1] == 'kept' and int(flt[-1]['questions']) >= 2
    report = json.loads((work / 'pools' / 'induced-tiny.report.json').read_text())
    n_dev = len((work / 'dev' / 'questions.jsonl').read_text().splitlines())
    assert sum(int(r['questions']) for r in flt) == report['filter']['candidates'] == n_dev   # each removed once
    meta = json.loads((work / 'out' / 'reveal_induction.metrics.json').read_text())
    assert [l.split(' (')[0] for l in meta['rubric_pools']] == ['rubric pool seed', 'rubric pool induced-tiny']


def _runs_reveal(p: dict) -> bool:
    from reveal_kit.eval.context import uses_pool
    ms = list(p.get('methods') or []) + [p.get('method'), p.get('sweep_method')]
    return any(uses_pool(m) for m in ms + list((p.get('oracle_methods') or {}).values()) if m)


def test_paper_params_name_the_induced_pool():
    "Every paper-scale params file that runs REVEAL names one pool: the recipe of the pool induced on Video-MME's dev split."
    from reveal_kit.eval.figures.common import pool_recipe
    ymls = [y for y in sorted(NB.glob('params/*/paper*.yaml')) if _runs_reveal(yaml.safe_load(y.read_text()))]
    assert len(ymls) == 13, ymls
    for y in ymls:
        p = yaml.safe_load(y.read_text())
        r = pool_recipe(p['setup']['rubric_pool'])
        assert (r['path'], r['benchmark'], r['split'], r['teacher'], r['proposer']) == (
            'rubrics/induced-videomme.yaml', 'videomme', 'medium', 'model', 'model'), y
        assert (r['benchmark'], r['split']) != (p['benchmark'], p['setup']['split']), y      # never the evaluated split


def test_reveal_figures_run_with_the_induced_pool(work):
    "On the generated benchmark REVEAL's methods run with the committed induced pool, and the figure says so."
    figs = run_nb('reveal_table1', work, tag='-pool', methods=['blind', 'base'])
    meta = json.loads((work / 'out-pool' / 'reveal_table1.metrics.json').read_text())
    assert len(meta['rubric_pools']) == 1 and meta['rubric_pools'][0].startswith('rubric pool induced-synth (induced on '
                                                                                   'synth/dev')
    run = next((work / 'out-pool').glob('*/base-*/run.json'))
    assert json.loads(run.read_text())['config']['rubric_pool'] == 'rubrics/induced-synth.yaml'
    assert json.loads(next((work / 'out-pool').glob('*/blind-*/run.json')).read_text())['config']['rubric_pool'] == ''


def test_paper_params_input_switches():
    "PACE's Video-MME runs read no subtitles (Table 2: 'Long (w/o sub)'); the egocentric ones cut at the query time."
    load = lambda n: yaml.safe_load((NB / 'params' / n).read_text())['setup']
    assert load('pace_main_tables/paper-videomme.yaml')['subtitles'] is False
    assert load('reveal_table1/paper.yaml')['subtitles'] is True
    assert all(load(f'reveal_table1/paper-{b}.yaml')['before_query'] is True for b in ('egolifeqa', 'egor1'))
