"""Run packs end to end: a demo-like run packed, replayed in a separate process with no model, no videos and an empty
runs folder, byte-identical once timings are set aside; the committed demo pack replays; damaged, hostile and
incomplete packs are refused; `reveal eval cost` prints its table."""
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from reveal_kit.backends.cache import CachedModel, CallCache
from reveal_kit.backends.chat import ScriptedModel
from reveal_kit.backends.replies import minimal_instance
from reveal_kit.eval.metrics import load_results
from reveal_kit.eval.pack import (PackError, canonical_results, canonical_traces, file_sums, run_differences, unpack,
                                  write_pack)
from reveal_kit.eval.pack_replay import replay_pack
from reveal_kit.eval.replay import pack_runs
from reveal_kit.eval.runner import run_eval
from reveal_kit.synth.bench import generate_benchmark

ROOT = Path(__file__).resolve().parents[1]
DEMO_PACK = ROOT / 'figures' / 'packs' / 'demo.tar.gz'
NO_MODEL = ("import sys\nfor m in ('llama_cpp', 'vllm', 'openai'): sys.modules[m] = None   # nothing can load a model\n"
            "from reveal_kit.cli.main import main\nsys.argv = ['reveal', 'replay', *sys.argv[1:]]\nmain()\n")


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    "A generated benchmark and the demo's two methods on it (embedded default: offline roles), in their own runs folder."
    d = tmp_path_factory.mktemp('packs')
    old = os.environ.get('REVEAL_RUNS')
    os.environ['REVEAL_RUNS'] = str(d / 'runs')
    generate_benchmark(d / 'bench', minutes=1.0, videos=2, questions_per_video=3, size=(320, 180), progress=False)
    t0 = time.time()
    for m in ('base', 'reveal'): run_eval('synth', m, d / f'eval-{m}', root=d / 'bench', progress=False)
    (d / 'run_seconds.txt').write_text(f"{time.time() - t0:.2f}")
    yield d
    if old is None: os.environ.pop('REVEAL_RUNS', None)
    else: os.environ['REVEAL_RUNS'] = old


def replay_elsewhere(pack: Path, out: Path, cwd: Path) -> subprocess.CompletedProcess:
    "`reveal replay PACK --out OUT` in a fresh process: outside the checkout, an empty runs folder, no model loadable."
    env = dict(os.environ, REVEAL_RUNS=str(cwd / 'empty-runs'), HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1')
    return subprocess.run([sys.executable, '-c', NO_MODEL, str(pack), '--out', str(out)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def test_demo_run_replays_byte_identically_without_a_model(work, tmp_path):
    "Pack the demo's runs, hide the videos, replay elsewhere with no model: results, traces and report match."
    pack = work / 'demo.tar.gz'
    s = pack_runs([work / 'eval-base', work / 'eval-reveal'], pack)
    n = {m: len(load_results(work / f'eval-{m}')) for m in ('base', 'reveal')}
    assert s['runs'] == ['eval-base', 'eval-reveal'] and s['questions'] == sum(n.values()) and s['memories'] == 4
    hidden = work / 'bench-hidden'
    (work / 'bench').rename(hidden)                  # the replaying machine has neither the videos nor the memories
    try:
        t0 = time.time()
        r = replay_elsewhere(pack, tmp_path / 'replayed', tmp_path)
        replay_s = time.time() - t0
    finally:
        hidden.rename(work / 'bench')
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count('identical to the packed run') == 2, r.stdout
    assert not (tmp_path / 'empty-runs' / 'memories').exists()              # nothing was built
    for m in ('base', 'reveal'):
        a, b = work / f'eval-{m}', tmp_path / 'replayed' / f'eval-{m}'
        assert run_differences(a, b) == []
        assert canonical_results(a) == canonical_results(b) and canonical_traces(a) == canonical_traces(b)
        assert len(load_results(b)) == n[m] > 0
    print(f"pack {s['bytes']} bytes ({s['unpacked_bytes']} unpacked); the runs took "
          f"{(work / 'run_seconds.txt').read_text()} s, the replay {replay_s:.1f} s")


def scripted_run(d: Path) -> tuple[Path, Path, CachedModel]:
    "A REVEAL run whose roles call a scripted model through a call cache: (run folder, cache, model)."
    def reply(messages, schema, role):
        out = minimal_instance(schema) if schema is not None else 'a caption'
        if isinstance(out, dict) and 'answer' in out: out['answer'] = 'A'
        return out
    model = CachedModel(ScriptedModel(reply, model_id='toy', supports_images=False), CallCache(d / 'calls.sqlite'))
    run_eval('synth', 'reveal', d / 'scripted', root=d / 'bench', model=model, roles='model', limit=2, progress=False)
    return d / 'scripted', d / 'calls.sqlite', model


def test_replay_miss_names_the_call(work, tmp_path):
    "A pack whose cache lost an entry (sums consistent): the replay stops on that call, naming question and role."
    run, cache, model = scripted_run(work)
    pack = tmp_path / 'calls.tar.gz'
    s = pack_runs([run], pack, cache=cache, model=model)
    assert s['calls'] > 0
    src = tmp_path / 'src'
    man = unpack(pack, src)
    lines = (src / 'cache' / 'calls.jsonl').read_text().splitlines()
    files = {n: src / n for n in man['files']}
    files['cache/calls.jsonl'] = ('\n'.join(lines[1:]) + '\n').encode()
    write_pack(tmp_path / 'less.tar.gz', files, {k: v for k, v in man.items() if k not in ('format', 'files')})
    with pytest.raises(Exception) as e:
        replay_pack(tmp_path / 'less.tar.gz', tmp_path / 'out')
    assert type(e.value).__name__ == 'CacheMiss' and 'question test-s0-' in str(e.value)
    assert "no cached call for role '" in str(e.value)
    assert replay_pack(pack, tmp_path / 'out-full')['identical']


def test_damaged_pack_is_refused_before_use(work, tmp_path):
    "One byte changed inside a member: the checksum stops the unpacking and nothing is replayed."
    pack = tmp_path / 'ok.tar.gz'
    pack_runs([work / 'eval-base'], pack)
    with tarfile.open(pack) as t: members = [(m, t.extractfile(m).read()) for m in t.getmembers()]
    bad = tmp_path / 'bad.tar.gz'
    with tarfile.open(bad, 'w:gz') as t:
        for m, data in members:
            if m.name.endswith('results.jsonl'): data = data.replace(b'"answer": "', b'"answer": "Z', 1)
            m.size = len(data)
            t.addfile(m, io.BytesIO(data))
    with pytest.raises(PackError, match='checksum mismatch for runs/eval-base/results.jsonl'):
        replay_pack(bad, tmp_path / 'out')
    assert not (tmp_path / 'out' / 'eval-base').exists()


def test_hostile_members_stay_inside(tmp_path):
    "A member named ../…, or a link, listed with a true sum, is refused and nothing lands outside the target."
    for name, kind in (('../outside.txt', 'file'), ('inner/link', 'link')):
        data = b'x' if kind == 'file' else b''
        man = json.dumps({'format': 'reveal-kit-pack/1', 'files': file_sums({name: data})}).encode()
        p = tmp_path / f"{kind}.tar.gz"
        with tarfile.open(p, 'w:gz') as t:
            ti = tarfile.TarInfo('pack.json')
            ti.size = len(man)
            t.addfile(ti, io.BytesIO(man))
            ti = tarfile.TarInfo(name)
            if kind == 'link': ti.type, ti.linkname = tarfile.SYMTYPE, '/etc/passwd'
            else: ti.size = len(data)
            t.addfile(ti, io.BytesIO(data) if kind == 'file' else None)
        with pytest.raises(PackError, match='refusing the pack member'):
            unpack(p, tmp_path / f'dest-{kind}')
    assert not (tmp_path / 'outside.txt').exists() and not (tmp_path / 'dest-link' / 'inner' / 'link').exists()


def test_zstd_pack(work, tmp_path):
    "`.tar.zst` (zstandard, a dependency): the same members, smaller."
    gz, zst = pack_runs([work / 'eval-base'], tmp_path / 'a.tar.gz'), pack_runs([work / 'eval-base'], tmp_path / 'a.tar.zst')
    assert zst['unpacked_bytes'] == gz['unpacked_bytes'] and zst['bytes'] < gz['bytes']
    assert replay_pack(tmp_path / 'a.tar.zst', tmp_path / 'out')['identical']


def test_committed_demo_pack_replays(tmp_path):
    "The committed pack of the demo's runs replays with this code, no model, byte-identically."
    assert DEMO_PACK.is_file(), f"{DEMO_PACK} is missing"
    r = replay_elsewhere(DEMO_PACK, tmp_path / 'replayed', tmp_path)
    assert r.returncode == 0 and r.stdout.count('identical to the packed run') == 2, (
        "the committed demo pack no longer replays with this code (the methods' behaviour changed since it was made);"
        " regenerate it: reveal demo --out /tmp/demo && reveal pack /tmp/demo/eval-base /tmp/demo/eval-reveal "
        f"--out figures/packs/demo.tar.gz\n{r.stdout}{r.stderr}")


def test_eval_cost_prints_the_table(work, tmp_path):
    "`reveal eval cost` on a run whose roles called a model: calls and tokens per role, depth, the projection."
    run = work / 'scripted' if (work / 'scripted').exists() else scripted_run(work)[0]
    prof = tmp_path / 'profile.json'
    prof.write_text(json.dumps({'model': 'toy', 'gpu': 'H200', 'points': [
        {'concurrency': 1, 'prompt_tokens_per_s': 8000, 'completion_tokens_per_s': 80},
        {'concurrency': 32, 'prompt_tokens_per_s': 60000, 'completion_tokens_per_s': 1500}]}))
    r = subprocess.run([sys.executable, '-c', 'from reveal_kit.cli.main import main; main()', 'eval', 'cost', str(run),
                        '--profile', str(prof), '--questions', '1267', '--gpus', '16'], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, HF_HUB_OFFLINE='1'))
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    assert 'planner' in r.stdout and 'verifier' in r.stdout and 'sequential depth' in r.stdout
    assert 'projection for 1267 questions on 16 × H200' in r.stdout and 'GPU-h' in r.stdout
