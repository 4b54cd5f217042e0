"""The lmms-eval adapter against the real lmms-eval package: entry-point registration, and lmms-eval's accuracy on a
local task over generated-benchmark questions equal to `reveal eval report`'s on the same questions."""
import importlib.util
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reveal_kit.cli.main import app
from reveal_kit.eval.loaders import load_synth
from reveal_kit.eval.lmms import LMMS_EXTRA, write_lmms_task
from reveal_kit.eval.metrics import load_results
from reveal_kit.eval.runner import run_eval
from reveal_kit.synth.bench import generate_benchmark

HAVE_LMMS = importlib.util.find_spec('lmms_eval') is not None
pytestmark = [pytest.mark.lmms,
              pytest.mark.skipif(not HAVE_LMMS, reason=f"needs the lmms extra (lmms-eval): {LMMS_EXTRA}")]
TASK = 'reveal_synth'


def _offline_env(tmp: Path) -> dict:
    "Environment of a hermetic run: no hub, memories and caches under tmp."
    return dict(os.environ, HF_HUB_OFFLINE='1', HF_DATASETS_OFFLINE='1', TRANSFORMERS_OFFLINE='1',
                HF_HOME=str(tmp / 'hf'), HF_DATASETS_CACHE=str(tmp / 'hf' / 'datasets'), REVEAL_RUNS=str(tmp / 'runs'),
                WANDB_MODE='disabled')


@pytest.fixture(scope='module')
def bench(tmp_path_factory):
    "One generated 1-minute video with four questions (seed 1: the offline agent gets some right, some wrong)."
    tmp = tmp_path_factory.mktemp('lmms')
    root = tmp / 'data'
    generate_benchmark(root, minutes=1, videos=1, questions_per_video=4, seed=1, progress=False)
    qs, rep = load_synth(root)
    assert rep.skipped == 0 and len(qs) == 4
    return tmp, root, qs


def test_entry_point_resolves_to_the_adapter_class():
    from lmms_eval.api.model import lmms
    from lmms_eval.models import get_model
    import reveal_kit.eval.lmms as A
    eps = {ep.name: ep.value for ep in entry_points(group='lmms_eval.models')}
    assert eps.get('reveal') == 'reveal_kit.eval.lmms:manifest', eps
    cls = get_model('reveal')
    assert cls is A.Reveal and issubclass(cls, lmms) and cls.is_simple


def test_model_args_and_unsupported_requests(tmp_path):
    from lmms_eval.models import get_model
    cls = get_model('reveal')
    m = cls.create_from_arg_string(f'method=base,backend=none,roles=offline,out_dir={tmp_path}', {'batch_size': 1})
    assert m.options == dict(method='base', backend='none', roles='offline', out_dir=tmp_path)
    with pytest.raises(TypeError, match=r"unknown reveal model_args \['temperature'\]"):
        cls.create_from_arg_string('method=reveal,temperature=0')
    with pytest.raises(NotImplementedError, match='loglikelihood is not supported'):
        m.loglikelihood([])
    with pytest.raises(NotImplementedError, match='generate_until_multi_round is not supported'):
        m.generate_until_multi_round([])


@pytest.mark.slow
def test_lmms_eval_accuracy_equals_reveal_eval_report(bench, monkeypatch):
    tmp, root, qs = bench
    env = _offline_env(tmp)
    monkeypatch.setenv('REVEAL_RUNS', env['REVEAL_RUNS'])
    task_dir = write_lmms_task(qs, tmp / 'task', TASK).parent
    lmms_run, out = tmp / 'lmms_run', tmp / 'lmms_out'
    cmd = [sys.executable, '-m', 'lmms_eval', '--model', 'reveal',
           '--model_args', f'method=reveal,backend=none,roles=offline,out_dir={lmms_run}',
           '--tasks', TASK, '--include_path', str(task_dir), '--output_path', str(out), '--log_samples',
           '--batch_size', '1']
    p = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])      # lmms-eval also exits 0 on an error:
    res_files = sorted(out.rglob('*_results.json'))
    assert len(res_files) == 1, (list(out.rglob('*')), p.stdout[-2000:])
    lmms_acc = json.loads(res_files[0].read_text())['results'][TASK]['accuracy,none']
    samples = [json.loads(l) for f in out.rglob(f'*_samples_{TASK}.jsonl') for l in f.read_text().splitlines() if l]
    first = lambda r: r[0] if isinstance(r, list) else r
    replies = {qs[s['doc_id']].qid: first(s['filtered_resps']) for s in samples}   # doc_id: row of the task JSONL

    kit_run = tmp / 'kit_run'
    run_eval('synth', 'reveal', kit_run, root=root, backend='none', roles='offline', progress=False)
    res = CliRunner().invoke(app, ['eval', 'report', str(kit_run), '--json'])
    assert res.exit_code == 0, res.output
    kit_acc = json.loads(res.output)['accuracy']
    kit_answers = {r['qid']: r['answer'] for r in load_results(kit_run)}

    assert len(samples) == len(qs) and set(replies) == {q.qid for q in qs}
    assert replies == kit_answers                           # the same letter for every question
    assert 0 < kit_acc < 1                                  # seed 1: right and wrong answers both occur
    assert lmms_acc == pytest.approx(kit_acc)
    lmms_rep = json.loads(CliRunner().invoke(app, ['eval', 'report', str(lmms_run), '--json']).output)
    assert (lmms_rep['n'], lmms_rep['accuracy']) == (len(qs), pytest.approx(kit_acc))   # the adapter's run folder
