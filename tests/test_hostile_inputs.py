"""Inputs that used to hang or crash a command, and settings that used to fail late: each is refused in one line
(exit 2) or becomes one failed question, and leaves nothing behind."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reveal_kit.synth.bench import generate_benchmark

REVEAL = [sys.executable, '-c', 'from reveal_kit.cli.main import main; main()']


def reveal(*args, cwd=None, timeout=240) -> subprocess.CompletedProcess:
    "The `reveal` command in a fresh process (a hang fails the test instead of blocking it)."
    env = dict(os.environ, HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1')
    return subprocess.run([*REVEAL, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


@pytest.fixture(scope='module')
def bench(tmp_path_factory):
    d = tmp_path_factory.mktemp('hostile')
    generate_benchmark(d / 'bench', minutes=1.0, videos=1, questions_per_video=2, size=(320, 180), progress=False)
    return d / 'bench'


def _with_video(bench: Path, dest: Path, make) -> Path:
    "A copy of the benchmark whose one video is replaced by `make(path)` (a FIFO, a link to a device, a loop)."
    shutil.copytree(bench, dest)
    v = next((dest / 'videos').glob('*.mp4'))
    v.unlink()
    make(v)
    return dest


ODD = {'fifo': os.mkfifo, 'dev-zero': lambda v: v.symlink_to('/dev/zero'), 'loop': lambda v: v.symlink_to(v.name)}


@pytest.mark.parametrize('kind', list(ODD))
def test_odd_video_paths_fail_their_questions_in_one_line(bench, tmp_path, kind):
    "A FIFO, a link to /dev/zero or a link loop: `eval run` ends (no hang), each question failed, the reason named."
    root = _with_video(bench, tmp_path / 'b', ODD[kind])
    r = reveal('eval', 'run', 'synth', '--root', root, '-m', 'base', '-o', tmp_path / 'run', '--quiet',
               '--backend', 'none', timeout=120)
    assert r.returncode == 0 and 'Traceback' not in r.stderr, r.stdout + r.stderr[-2000:]
    rows = [json.loads(x) for x in (tmp_path / 'run' / 'results.jsonl').read_text().splitlines()]
    assert len(rows) == 2 and all(x['failed'] for x in rows)
    why = {'fifo': 'is a FIFO', 'dev-zero': 'is a device', 'loop': 'Too many levels of symbolic links'}[kind]
    assert all(why in x['error'] for x in rows), rows[0]['error']


@pytest.mark.parametrize('kind', list(ODD))
def test_data_check_does_not_count_odd_videos_as_present(bench, tmp_path, kind):
    root = _with_video(bench, tmp_path / 'b', ODD[kind])
    r = reveal('data', 'check', 'synth', '--root', root, timeout=60)
    assert 'videos: 1 distinct (expected 1), 0 present, 1 missing' in r.stdout, r.stdout + r.stderr


def test_memory_of_a_fifo_is_refused_in_one_line(bench, tmp_path):
    "`memory build` of a FIFO is refused at once (it used to be hashed forever)."
    os.mkfifo(tmp_path / 'v.mp4')
    r = reveal('memory', 'build', tmp_path / 'v.mp4', timeout=60)
    assert r.returncode == 2 and r.stderr.strip().startswith('error:') and 'is a FIFO' in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- settings that fail loudly, before anything is written
def _cli():
    from reveal_kit.cli.main import app
    from reveal_kit.testing.commands import cli_for
    return cli_for(app)


def test_a_bogus_backend_is_refused_and_leaves_the_folder_usable(bench, tmp_path):
    "`--backend bogus` exits 2 in one line with no folder made; the right command then runs in that folder."
    from reveal_kit.cli.runs import eval_run
    cli, out = _cli(), tmp_path / 'run'
    r = cli(eval_run, 'synth', '--root', bench, '-m', 'base', '-o', out, '--quiet', '--backend', 'bogus')
    assert r.exit_code == 2 and r.output.strip() == ("error: unknown backend 'bogus': choose one of none, embedded, "
                                                     "http, vllm, scripted"), r.output
    assert not out.exists()
    r = cli(eval_run, 'synth', '--root', bench, '-m', 'base', '-o', out, '--quiet', '--backend', 'none')
    assert r.exit_code == 0 and '2 run, 0 already done, 0 failed' in r.output, r.output


@pytest.mark.parametrize('args,why', [
    (['synth', '{tmp}/s', '--minutes', 'inf'], '--minutes must be a finite number of minutes > 0'),
    (['synth', '{tmp}/s', '--width', '321'], '--width must be an even number of pixels ≥ 16'),
    (['synth', '{tmp}/s', '--height', '181'], '--height must be an even number of pixels ≥ 16'),
    (['synth', '{tmp}/s', '--fps', '0'], '--fps must be a finite number of frames per second > 0'),
    (['eval', 'run', 'synth', '--root', '{bench}', '-m', 'base', '-o', '{tmp}/s', '--shard', 'a/b'],
     "shard must be i/n with 0 <= i < n, got 'a/b'"),
    (['eval', 'run', 'synth', '--root', '{bench}', '-m', 'base', '-o', '{tmp}/s', '-c', '0'],
     'concurrency must be a whole number of questions in flight ≥ 1, got 0'),
    (['eval', 'compare', '{tmp}', '{tmp}', '--n-boot', '0'], 'n_boot must be a whole number of bootstrap resamples ≥ 1'),
])
def test_out_of_range_options_are_one_line(bench, tmp_path, args, why):
    from typer.testing import CliRunner
    from reveal_kit.cli.main import app
    if args[:2] == ['eval', 'compare']:                         # two real (tiny) runs to compare
        from reveal_kit.eval.runner import run_eval
        run_eval('synth', 'blind', tmp_path / 'a', root=bench, progress=False)
        args = ['eval', 'compare', str(tmp_path / 'a'), str(tmp_path / 'a'), '--n-boot', '0']
    r = CliRunner().invoke(app, [a.format(tmp=tmp_path, bench=bench) for a in args])
    assert r.exit_code == 2 and r.output.strip() == f"error: {r.output.strip()[7:]}" and why in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / 's').exists()


def test_a_rubric_pool_with_a_nan_weight_is_refused(bench, tmp_path):
    "A pool whose weight is .nan is refused where it is loaded (it used to make every ρ NaN)."
    import yaml
    from reveal_kit.reveal.rubrics import default_pool_path
    d = yaml.safe_load(Path(default_pool_path()).read_text())
    d['criteria'][0]['weight'] = float('nan')
    (tmp_path / 'pool.yaml').write_text(yaml.safe_dump(d))
    from reveal_kit.cli.runs import eval_run
    r = _cli()(eval_run, 'synth', '--root', bench, '-m', 'reveal', '-o', tmp_path / 'run', '--quiet', '--backend',
               'none', '--set', f"rubric_pool={tmp_path / 'pool.yaml'}")
    assert r.exit_code == 2 and 'weight must be a finite number > 0, got nan' in r.output, r.output


def test_a_clip_inside_another_builds_one_timeline(tmp_path):
    "11:00:00 for 20 s and 11:00:05 for 5 s (inside it): the memory covers 20 s (it used to fail after decoding)."
    from reveal_kit.eval.loaders import egolife_seconds
    from reveal_kit.memory.build import OfflineMemory
    from reveal_kit.testing.videos import make_test_video
    folder = tmp_path / 'A1_JAKE'
    make_test_video(folder / 'DAY1' / 'DAY1_A1_JAKE_11000000.mp4', [(10, 1), (10, 2)], fps=4)
    make_test_video(folder / 'DAY1' / 'DAY1_A1_JAKE_11000500.mp4', [(5, 3)], fps=4)
    r = reveal('memory', 'build', folder, '--out', tmp_path / 'mem', '--json', timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    l1 = OfflineMemory.load(tmp_path / 'mem').level(1)
    t0 = egolife_seconds('DAY1', '11000000')
    assert l1[0].t_start == t0 and abs(l1[-1].t_end - (t0 + 20)) < 0.6, [(x.t_start, x.t_end) for x in l1]
