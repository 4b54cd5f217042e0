"""Ray Data over a benchmark on a local two-CPU cluster: the same rows as in-process, and no loss when a worker dies."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from reveal_kit.eval import methods
from reveal_kit.io import read_jsonl_rows
from reveal_kit.eval.ray import RayRunFailed, build_all, run_eval_ray
from reveal_kit.eval.runner import run_eval

# Fields that differ between two runs of the same questions: timings, and the trace path (it names the run folder;
# the trace file's name is compared instead).
TIMING = ('seconds', 'wall_seconds', 'model_seconds', 'loop_seconds')

# A plugin module the Ray workers import (methods.PLUGINS travels with the run). It arms itself only where
# KIT_TEST_FAULT_DIR is set, i.e. in Ray workers (set through the cluster's runtime_env, never in this process),
# and kills its own worker process once, mid-task, when a `<stage>.armed` file exists:
# - build: right after the first L1 caption line of the second memory is on disk (the first memory is complete);
# - eval: on its third question, once the driver has recorded the first two result lines.
FAULTS = '''
import json, os, signal, time
from pathlib import Path
import reveal_kit.memory.build as mb
import reveal_kit.eval.methods as rm

D = os.environ.get('KIT_TEST_FAULT_DIR')

def _die_once(stage, state):
    if not (Path(D) / f'{stage}.armed').exists() or (Path(D) / f'{stage}.killed').exists(): return
    (Path(D) / f'{stage}.killed').write_text(json.dumps(state))
    os.kill(os.getpid(), signal.SIGKILL)

if D:
    _append, _answer = mb.append_jsonl, rm.answer_question

    def append_jsonl(path, row):
        _append(path, row)
        p = Path(path)
        done = {str(d): (d / 'manifest.json').stat().st_mtime_ns for d in p.parent.parent.iterdir()
                if (d / 'manifest.json').exists()}
        if p.name == 'l1.jsonl' and done:
            _die_once('build', dict(dir=str(p.parent), l1=p.read_text().splitlines(), complete=done))

    calls = []

    def answer_question(q, *a, trace_dir=None, **kw):
        res = Path(trace_dir).parent / 'results.jsonl'
        calls.append(q.qid)
        if len(calls) > 2 and (Path(D) / 'eval.armed').exists() and not (Path(D) / 'eval.killed').exists():
            for _ in range(300):
                if res.exists() and len(res.read_text().splitlines()) >= 2: break
                time.sleep(0.1)
            _die_once('eval', dict(qid=q.qid, lines=res.read_text().splitlines() if res.exists() else []))
        return _answer(q, *a, trace_dir=trace_dir, **kw)

    mb.append_jsonl, rm.answer_question = append_jsonl, answer_question
'''


@pytest.fixture(scope='module')
def env(tmp_path_factory):
    "A generated benchmark (2 one-minute videos), its own runs folder, and a local 2-CPU Ray cluster with the faults."
    from reveal_kit.synth.bench import generate_benchmark
    base = tmp_path_factory.mktemp('ray')
    faults = base / 'faults'
    faults.mkdir()
    (faults / 'kit_test_faults.py').write_text(FAULTS)
    old_runs = os.environ.get('REVEAL_RUNS')
    os.environ['REVEAL_RUNS'] = str(base / 'runs')
    sys.path.insert(0, str(faults))
    methods.PLUGINS.append('kit_test_faults')
    generate_benchmark(base / 'bench', minutes=1, videos=2, questions_per_video=3, seed=0, progress=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={'env_vars': {'PYTHONPATH': str(faults), 'KIT_TEST_FAULT_DIR': str(faults)}})
    yield dict(bench=base / 'bench', faults=faults)
    ray.shutdown()
    methods.PLUGINS.remove('kit_test_faults')
    sys.path.remove(str(faults))
    if old_runs is None: os.environ.pop('REVEAL_RUNS', None)
    else: os.environ['REVEAL_RUNS'] = old_runs


def rows_of(run_dir: Path) -> list[str]:
    "A run's result rows as canonical JSON, sorted: timing fields dropped, the trace path reduced to its file name."
    return sorted(json.dumps({k: (Path(v).name if k == 'trace' else v) for k, v in r.items() if k not in TIMING},
                             sort_keys=True) for r in read_jsonl_rows(run_dir / 'results.jsonl'))


def test_build_all_on_ray_survives_a_killed_worker(env):
    (env['faults'] / 'build.armed').touch()
    s = build_all('synth', root=env['bench'], ray_address='local', concurrency=1)
    killed = json.loads((env['faults'] / 'build.killed').read_text())          # a worker did die mid-build
    assert (s['memories'], s['built'], s['reused'], s['failed']) == (2, 2, 0, []), s
    for d, mtime in killed['complete'].items():                                 # the finished memory was kept as is
        assert (Path(d) / 'manifest.json').stat().st_mtime_ns == mtime
    l1 = (Path(killed['dir']) / 'l1.jsonl').read_text().splitlines()            # the killed one resumed its lines
    assert l1[:len(killed['l1'])] == killed['l1'] and len(l1) > len(killed['l1'])
    assert (Path(killed['dir']) / 'manifest.json').exists()
    again = build_all('synth', root=env['bench'])                               # in-process: the same folders
    assert (again['built'], again['reused'], again['failed']) == (0, 2, [])


def test_eval_on_ray_equals_in_process_and_resumes_after_a_killed_worker(env, tmp_path):
    kw = dict(root=env['bench'], backend='none', roles='offline', progress=False)
    ref = run_eval('synth', 'reveal', tmp_path / 'local', **kw)
    n = ref['ran']
    assert n >= 4 and ref['failed'] == 0
    s = run_eval_ray('synth', 'reveal', tmp_path / 'ray', 'local', concurrency=2, **kw)
    assert (s['ran'], s['failed']) == (n, 0)
    assert rows_of(tmp_path / 'ray') == rows_of(tmp_path / 'local')

    (env['faults'] / 'eval.armed').touch()
    with pytest.raises(RayRunFailed, match='rerun the same command'):
        run_eval_ray('synth', 'reveal', tmp_path / 'killed', 'local', concurrency=1, retries=0, **kw)
    killed = json.loads((env['faults'] / 'eval.killed').read_text())
    kept = (tmp_path / 'killed' / 'results.jsonl').read_text().splitlines()
    assert len(killed['lines']) >= 2 and kept[:len(killed['lines'])] == killed['lines']    # nothing recorded was lost
    assert killed['qid'] not in {json.loads(line)['qid'] for line in kept} and len(kept) < n
    s = run_eval_ray('synth', 'reveal', tmp_path / 'killed', 'local', concurrency=2, **kw)
    assert (s['skipped_finished'], s['ran']) == (len(kept), n - len(kept))
    qids = [r['qid'] for r in read_jsonl_rows(tmp_path / 'killed' / 'results.jsonl')]
    assert len(qids) == len(set(qids)) == n                                     # no duplicates
    assert rows_of(tmp_path / 'killed') == rows_of(tmp_path / 'local')


LISTENERS = r'''
import json, os, subprocess, sys, time
from reveal_kit.eval.ray import connect_ray
ray = connect_ray('local')
@ray.remote
def pid(): return os.getpid()
worker = ray.get(pid.remote())
time.sleep(1)
def children(p):
    try: return [int(x) for x in open(f'/proc/{p}/task/{p}/children').read().split()]
    except OSError: return []
tree, todo = set(), [os.getpid()]
while todo:
    p = todo.pop()
    tree.add(p)
    todo += children(p)
rows = subprocess.run(['ss', '-ltnpH'], capture_output=True, text=True).stdout.splitlines()
mine = [r for r in rows if any(f'pid={p},' in r for p in tree)]
print(json.dumps({'worker': worker, 'tree': sorted(tree), 'listeners': mine}))
ray.shutdown()
'''


def test_a_fresh_local_cluster_listens_on_loopback_only(tmp_path):
    "`--ray local` with no cluster running starts one whose every server (GCS, raylet, workers, driver) is on 127.0.0.1."
    env = {k: v for k, v in os.environ.items() if k not in ('RAY_ADDRESS', 'RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER')}
    out = subprocess.run([sys.executable, '-c', LISTENERS], capture_output=True, text=True, env=env, timeout=240,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got['worker'] in got['tree'] and len(got['listeners']) >= 3        # driver, GCS, raylet and a worker
    local = ('127.0.0.1:', '[::ffff:127.0.0.1]:', '[::1]:')
    wide = [r for r in got['listeners'] if not r.split()[3].startswith(local)]
    assert not wide, 'listening beyond loopback:\n' + '\n'.join(wide)
