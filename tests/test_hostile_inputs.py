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
