"""The experiment notebooks run through papermill with tiny parameters; each test asserts on the CSVs it wrote."""
import csv
import os
from pathlib import Path
import papermill as pm
import pytest
from reveal_kit.metrics import load_results

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


def run_nb(name: str, work: Path, tag: str = '', **params) -> Path:
    "Execute nbs/experiments/<name>.ipynb with tiny parameters; returns the folder its figures went to."
    figs = work / f'figs{tag}'
    (work / 'executed').mkdir(exist_ok=True)
    p = dict(TINY, root=str(work / 'bench'), out_dir=str(work / f'out{tag}'), fig_dir=str(figs), **params)
    pm.execute_notebook(str(NB / f'{name}.ipynb'), str(work / 'executed' / f'{name}{tag}.ipynb'), parameters=p,
                        kernel_name='python3', progress_bar=False, cwd=str(NB))
    return figs


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
    methods = ['base', '+iter', '+offmem', '+onmem', 'reveal', 'rerank_only', 'verify_only']
    figs = run_nb('reveal_table2', work, methods=methods, n_boot=200)
    assert [r['method'] for r in rows(figs / 'reveal_table2.csv')] == methods
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


def test_fig4b(work):
    figs = run_nb('reveal_fig4b', work)
    t = rows(figs / 'reveal_fig4b.csv')
    assert {r['arm'] for r in t} >= {'REVEAL (retrieved evidence)'}
    assert [r['verdict'] for r in t][:2] == ['sufficient', 'insufficient']
    plain = [r for r in t if r['arm'] == 'REVEAL (retrieved evidence)']
    assert sum(int(r['n']) for r in plain) <= 2 and all(in_unit(r['accuracy']) for r in t)


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
    assert all(float(r['seconds_total']) > 0 and float(r['rounds_mean']) >= 1 for r in cost)
    hist = rows(figs / 'reveal_tables34_rounds.csv')
    assert [(r['method'], r['rounds']) for r in hist] == [(m, str(k)) for m in ('base', 'reveal') for k in (1, 2, 3)]
    assert all(sum(int(r['questions']) for r in hist if r['method'] == m) == 2 for m in ('base', 'reveal'))


def test_replay_miss_fails_loudly(work):
    "Replay with an empty cache: the first model call fails, naming the role and the cache."
    with pytest.raises(pm.PapermillExecutionError) as e:
        run_nb('reveal_table1', work, tag='-miss', methods=['blind'], roles='model', cache_mode='replay',
               cache=str(work / 'empty.sqlite'))
    assert 'CacheMiss' in str(e.value) and 'empty.sqlite' in str(e.value)


@pytest.mark.slow
def test_replay_reproduces_csv(work):
    "The embedded model really called in-process (roles='model'), then replayed from its cache: the same CSV bytes."
    kw = dict(methods=['blind'], roles='model', cache=str(work / 'calls.sqlite'))
    first = run_nb('reveal_table1', work, tag='-rw', cache_mode='readwrite', **kw)
    again = run_nb('reveal_table1', work, tag='-replay', cache_mode='replay', **kw)
    a, b = (first / 'reveal_table1.csv').read_bytes(), (again / 'reveal_table1.csv').read_bytes()
    assert a == b and b'blind' in a
    res = load_results(next((work / 'out-replay').glob('*/blind-*')))
    assert len(res) == 2 and all(r['llm_calls'] == 1 for r in res)     # each answer: one model call, replayed
