"""Run packs of PACE and DVD runs: pack size and replay time against the original run (issue 33, item 1).

Generates a small benchmark, answers it with each method in a fresh runs folder (so the PACE databases are built, as a
first run builds them), packs each run alone, hides the benchmark and replays each pack in a fresh process with no model
loadable and an empty runs folder, then prints one line per method.

    .venv/bin/python benchmarks/pack_bench.py [--out runs/bench/packs] [--videos 2] [--minutes 1] \
        [--methods pace,dvd]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')

NO_MODEL = ("import sys\nfor m in ('llama_cpp', 'vllm', 'openai'): sys.modules[m] = None\n"
            "from reveal_kit.cli.main import main\nsys.argv = ['reveal', 'replay', *sys.argv[1:]]\nmain()\n")


def replay_elsewhere(pack: Path, out: Path) -> tuple[float, str]:
    "Seconds `reveal replay PACK` took in a fresh process with no model and an empty runs folder, and its output."
    env = dict(os.environ, REVEAL_RUNS=str(out.parent / 'empty-runs'))
    t0 = time.time()
    r = subprocess.run([sys.executable, '-c', NO_MODEL, str(pack), '--out', str(out)], env=env,
                       capture_output=True, text=True, timeout=1800)
    return time.time() - t0, r.stdout + r.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--out', default='runs/bench/packs')
    ap.add_argument('--videos', type=int, default=2)
    ap.add_argument('--minutes', type=float, default=1.0)
    ap.add_argument('--methods', default='pace,dvd')
    a = ap.parse_args()
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    os.environ['REVEAL_RUNS'] = str(out / 'runs')
    from reveal_kit.synth.bench import generate_benchmark
    from reveal_kit.eval.runner import run_eval
    from reveal_kit.eval.replay import pack_runs
    generate_benchmark(out / 'bench', minutes=a.minutes, videos=a.videos, questions_per_video=3, size=(320, 180),
                       progress=False)
    print(f"{'method':<10}{'run s':>8}{'pack KiB':>10}{'unpacked':>10}{'pack s':>8}{'replay s':>10}  replay says")
    for m in a.methods.split(','):
        t0 = time.time()
        run_eval('synth', m, out / m, root=out / 'bench', progress=False)
        run_s = time.time() - t0
        s = pack_runs([out / m], out / f'{m}.tar.gz')
        (out / 'bench').rename(out / 'bench-hidden')
        try: replay_s, said = replay_elsewhere(out / f'{m}.tar.gz', out / f'replayed-{m}')
        finally: (out / 'bench-hidden').rename(out / 'bench')
        verdict = 'identical' if 'identical to the packed run' in said else said.strip().splitlines()[-1]
        print(f"{m:<10}{run_s:>8.1f}{s['bytes'] / 1024:>10.0f}{s['unpacked_bytes'] / 1024:>10.0f}"
              f"{s['seconds']:>8.1f}{replay_s:>10.1f}  {verdict}")


if __name__ == '__main__':
    main()
