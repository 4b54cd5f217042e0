"""Run packs end to end: a demo-like run packed, replayed in a separate process with no model, no videos and an empty
runs folder, byte-identical once timings are set aside; the committed demo pack replays; damaged, hostile and
incomplete packs are refused; `reveal eval cost` prints its table."""
import io
import json
import os
import random
import re
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


def scripted_run(d: Path, out: Path | None = None) -> tuple[Path, Path, CachedModel]:
    "A REVEAL run (on `d`'s benchmark, into `out`, default `d`) whose roles call a scripted model through a call cache."
    out = out or d
    def reply(messages, schema, role):
        out = minimal_instance(schema) if schema is not None else 'a caption'
        if isinstance(out, dict) and 'answer' in out: out['answer'] = 'A'
        return out
    model = CachedModel(ScriptedModel(reply, model_id='toy', supports_images=False), CallCache(out / 'calls.sqlite'))
    run_eval('synth', 'reveal', out / 'scripted', root=d / 'bench', model=model, roles='model', limit=2, progress=False)
    return out / 'scripted', out / 'calls.sqlite', model


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
    "One byte changed inside a member (its size kept): the checksum stops the unpacking and nothing is replayed."
    pack = tmp_path / 'ok.tar.gz'
    pack_runs([work / 'eval-base'], pack)
    with tarfile.open(pack) as t: members = [(m, t.extractfile(m).read()) for m in t.getmembers()]
    bad = tmp_path / 'bad.tar.gz'
    with tarfile.open(bad, 'w:gz') as t:
        for m, data in members:
            if m.name.endswith('results.jsonl'): data = re.sub(rb'"answer": "[A-Y]"', b'"answer": "Z"', data, count=1)
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


EVERY_METHOD = ('blind', 'direct', 'direct-subs', 'reveal+oracle', 'verify_only', 'pace', 'pace-no-qcindex',
                'pace-factors-2', 'dvd')


def test_every_method_packs_and_replays_without_model_or_video(work, tmp_path):
    "Baselines, REVEAL presets and a calibration arm, PACE variants and DVD: one pack, replayed elsewhere, identical."
    took = {}
    for m in EVERY_METHOD:
        t0 = time.time()
        run_eval('synth', m, work / f'every-{m}', root=work / 'bench', progress=False)
        took[m] = time.time() - t0
    runs = [work / f'every-{m}' for m in EVERY_METHOD] + [work / 'eval-base', work / 'eval-reveal']
    sizes = {}
    for m in ('pace', 'dvd'):                          # one pack each, to measure them alone
        s = pack_runs([work / f'every-{m}'], tmp_path / f'{m}.tar.gz')
        sizes[m] = (s['bytes'], s['unpacked_bytes'])
    s = pack_runs(runs, tmp_path / 'every.tar.gz')
    assert s['runs'] == [r.name for r in runs]
    man = json.loads(tarfile.open(tmp_path / 'every.tar.gz').extractfile('pack.json').read())
    assert any(k.endswith('|pace-plain') for r in man['runs'] for k in r['memory_index'])
    hidden = work / 'bench-hidden'
    (work / 'bench').rename(hidden)
    try:
        secs = {}
        for m in ('pace', 'dvd'):
            t0 = time.time()
            r = replay_elsewhere(tmp_path / f'{m}.tar.gz', tmp_path / f'replayed-{m}', tmp_path)
            secs[m] = time.time() - t0
            assert r.returncode == 0 and 'identical to the packed run' in r.stdout, r.stdout + r.stderr
        r = replay_elsewhere(tmp_path / 'every.tar.gz', tmp_path / 'replayed', tmp_path)
    finally:
        hidden.rename(work / 'bench')
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count('identical to the packed run') == len(runs), r.stdout
    assert not (tmp_path / 'empty-runs' / 'memories').exists() and not (tmp_path / 'empty-runs' / 'pace').exists()
    for m in ('pace', 'dvd'):
        print(f"{m}: run {took[m]:.1f} s; pack {sizes[m][0] / 1024:.0f} KiB ({sizes[m][1] / 1024:.0f} KiB unpacked); "
              f"replay in a fresh process {secs[m]:.1f} s")


def test_http_run_packs_from_the_command_line(work, tmp_path):
    "`reveal pack` of a run made with `--backend http` (a fake server): packed from its folder alone, replays."
    from reveal_kit.testing.fakes import FakeChatServer
    from reveal_kit.backends.replies import minimal_instance

    def answer(payload):
        fmt = payload.get('response_format') or {}
        schema = (fmt.get('json_schema') or {}).get('schema') or fmt.get('schema')
        out = minimal_instance(schema) if schema else 'a short caption'
        if isinstance(out, dict) and 'answer' in out: out['answer'] = 'A'
        return json.dumps(out) if schema else out

    env = dict(os.environ, HF_HUB_OFFLINE='1', REVEAL_RUNS=str(work / 'runs'))
    cli = [sys.executable, '-c', 'from reveal_kit.cli.main import main; main()']
    with FakeChatServer(answer, model='served') as srv:
        r = subprocess.run(cli + ['eval', 'run', 'synth', '--method', 'reveal', '--root', str(work / 'bench'), '--out',
                                  str(tmp_path / 'http-run'), '--backend', 'http', '--base-url', srv.url, '--model',
                                  'served', '--roles', 'model', '--limit', '2'],
                           capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(cli + ['pack', str(tmp_path / 'http-run'), '--out', str(tmp_path / 'http.tar.gz')],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and 'packed 1 run(s)' in r.stdout, r.stdout + r.stderr
    r = replay_elsewhere(tmp_path / 'http.tar.gz', tmp_path / 'replayed', tmp_path)
    assert r.returncode == 0 and 'identical to the packed run' in r.stdout, r.stdout + r.stderr


def test_damaged_or_lying_packs_exit_2_or_1(work, tmp_path):
    "Cut, random, empty, mislabelled: one line, exit 2; pack.json relabelling a run: reported, exit 1."
    pack = tmp_path / 'ok.tar.gz'
    pack_runs([work / 'eval-base'], pack)
    good = pack.read_bytes()
    for name, data in (('cut.tar.gz', good[:len(good) // 2]), ('noise.tar.gz', random.Random(0).randbytes(4096)),
                       ('empty.tar.gz', b''), ('gz.tar.zst', good)):
        (tmp_path / name).write_bytes(data)
        r = replay_elsewhere(tmp_path / name, tmp_path / f'out-{name}', tmp_path)
        assert r.returncode == 2 and r.stderr.count('\n') == 1 and r.stderr.startswith('error: '), r.stderr
    src = tmp_path / 'src'
    man = unpack(pack, src)
    files = {n: src / n for n in man['files']}
    rest = {k: v for k, v in man.items() if k not in ('format', 'files', 'runs')}
    row = dict(man['runs'][0], method='base', benchmark='videomme', questions=900)
    write_pack(tmp_path / 'relabelled.tar.gz', files, dict(rest, runs=[row]))
    r = replay_elsewhere(tmp_path / 'relabelled.tar.gz', tmp_path / 'out-relabelled', tmp_path)
    assert r.returncode == 1 and "pack.json says benchmark 'videomme'" in r.stdout, r.stdout + r.stderr
    write_pack(tmp_path / 'empty-runs.tar.gz', files, dict(rest, runs=[]))
    r = replay_elsewhere(tmp_path / 'empty-runs.tar.gz', tmp_path / 'out-empty-runs', tmp_path)
    assert r.returncode == 2 and 'lists no runs' in r.stderr
    write_pack(tmp_path / 'escape.tar.gz', files, dict(rest, runs=[dict(man['runs'][0], name='../../x/runs/r1')]))
    r = replay_elsewhere(tmp_path / 'escape.tar.gz', tmp_path / 'a' / 'b' / 'out', tmp_path)
    assert r.returncode == 2 and not (tmp_path / 'x').exists()


KILLED_OPEN = """import os, signal, sys
from reveal_kit.backends.cache import CallCache
from reveal_kit.eval.pack_replay import open_pack
put = CallCache.put
def put_then_die(self, key, entry):
    put(self, key, entry)
    os.kill(os.getpid(), signal.SIGKILL)        # killed while loading the pack's calls
CallCache.put = put_then_die
open_pack(sys.argv[1], sys.argv[2])
"""


def test_open_pack_survives_a_kill(work, tmp_path):
    "A first opening killed while it loads the calls: the next opening is whole and its run replays identically."
    from reveal_kit.eval.pack_replay import open_pack, replayed_run
    run, cache, model = scripted_run(work, tmp_path)
    pack = tmp_path / 'calls.tar.gz'
    pack_runs([run], pack, cache=cache, model=model)
    r = subprocess.run([sys.executable, '-c', KILLED_OPEN, str(pack), str(tmp_path / 'opened')], timeout=300)
    assert r.returncode == -9
    d, man = open_pack(pack, tmp_path / 'opened')
    assert [p.name for p in (tmp_path / 'opened').iterdir()] == [d.name]
    assert run_differences(run, replayed_run(d, man, 'scripted')) == []


def test_eval_cost_refuses_settings_out_of_range(work, tmp_path):
    "`--gpus 0`, `--gpus -4`, `--questions 0`, `--concurrency nan`, an Infinity throughput: one line, exit 2."
    prof = tmp_path / 'profile.json'
    prof.write_text('{"model": "toy", "gpu": "H200", "points": [{"concurrency": 1, "prompt_tokens_per_s": 8000, '
                    '"completion_tokens_per_s": 80}]}')
    inf = tmp_path / 'inf.json'
    inf.write_text(prof.read_text().replace('80}', 'Infinity}'))
    base = [sys.executable, '-c', 'from reveal_kit.cli.main import main; main()', 'eval', 'cost', str(work / 'eval-base')]
    for extra in (['--gpus', '0'], ['--gpus', '-4'], ['--questions', '0'], ['--concurrency', 'nan']):
        r = subprocess.run(base + ['--profile', str(prof)] + extra, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and r.stderr.count('\n') == 1 and extra[0] in r.stderr, (extra, r.stderr)
    r = subprocess.run(base + ['--profile', str(inf)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and 'positive, finite' in r.stderr, r.stderr


def test_model_pace_run_replays_without_model_or_video(work, tmp_path):
    "PACE whose roles and captioner call a (scripted, image-capable) model: databases and calls packed, replayed."
    def reply(messages, schema, role):
        out = minimal_instance(schema) if schema is not None else 'a caption'
        if isinstance(out, dict) and 'answer' in out: out['answer'] = 'A'
        return out
    model = CachedModel(ScriptedModel(reply, model_id='toy-vl', supports_images=True), CallCache(tmp_path / 'c.sqlite'))
    run_eval('synth', 'pace', tmp_path / 'pace-model', root=work / 'bench', model=model, roles='model', limit=2,
             progress=False)
    assert all(r['llm_calls'] > 0 for r in load_results(tmp_path / 'pace-model'))
    s = pack_runs([tmp_path / 'pace-model'], tmp_path / 'pm.tar.gz', cache=tmp_path / 'c.sqlite', model=model)
    assert s['calls'] > 0
    hidden = work / 'bench-hidden'
    (work / 'bench').rename(hidden)
    try: r = replay_elsewhere(tmp_path / 'pm.tar.gz', tmp_path / 'replayed', tmp_path)
    finally: hidden.rename(work / 'bench')
    assert r.returncode == 0 and 'identical to the packed run' in r.stdout, r.stdout + r.stderr
