"""Start-up benchmark: wall seconds and peak memory of everyday CLI commands on an existing memory.

Each command runs as a fresh process, `--repeats` times (default 3); the table shows the median wall time and the
median peak resident memory (`ru_maxrss` of that child, from `os.wait4`). Before timing, it builds a small memory of a
generated 9-second video (one `reveal memory build`, not timed), so every timed command finds a finished memory:

| command | target |
|---|---|
| `reveal --help`, and `reveal CMD --help` for every command and subcommand | ≤ 0.5 s |
| `reveal ask VIDEO -q … -o … --memory DIR` | ≤ 1.5 s |
| `reveal memory build VIDEO --out DIR` (a reuse) | ≤ 1.5 s |
| `reveal memory show DIR` | ≤ 1 s |
| `reveal backends check` | ≤ 3 s |

It also reports which heavy modules (torch, sentence_transformers, transformers, rapidocr, onnxruntime, cv2, av, …)
each command imported, from `python -X importtime`, and the CPU seconds (user + system) of the process.

    .venv/bin/python benchmarks/startup_bench.py [--repeats 3] [--work DIR] [--out runs/bench/startup_bench.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ('torch', 'sentence_transformers', 'transformers', 'FlagEmbedding', 'open_clip', 'rapidocr',
         'rapidocr_onnxruntime', 'onnxruntime', 'tokenizers', 'cv2', 'av', 'pandas', 'scipy', 'sklearn', 'llama_cpp',
         'vllm', 'httpx', 'matplotlib')
TARGETS = {'help': 0.5, 'ask': 1.5, 'memory build (reuse)': 1.5, 'memory show': 1.0, 'backends check': 3.0}
HELP_TARGET = 0.5


def command_paths() -> list[list[str]]:
    "Every command and subcommand of `reveal`, as the words that name it (from the click tree, not hard-coded)."
    import typer
    from reveal_kit.cli.main import app
    def walk(cmd, path):
        subs = getattr(cmd, 'commands', {})
        return [path] + [p for n, c in sorted(subs.items()) for p in walk(c, path + [n])] if path else \
            [p for n, c in sorted(subs.items()) for p in walk(c, [n])]
    return walk(typer.main.get_command(app), [])


def reveal_cmd() -> list[str]:
    "The `reveal` entry point of this interpreter's environment."
    exe = Path(sys.executable).parent / 'reveal'
    return [str(exe)] if exe.exists() else [sys.executable, '-c', 'from reveal_kit.cli.main import main; main()']


def timed(argv: list[str], env: dict) -> tuple[float, float, int, str, float]:
    "Run `argv`; (wall s, peak RSS MB of that child, exit code, stderr tail, CPU s of the child)."
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = p.stderr.read().decode(errors='replace')
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t, ru.ru_maxrss / 1024, p.returncode, err[-1500:], ru.ru_utime + ru.ru_stime


def heavy_imports(argv: list[str], env: dict) -> list[str]:
    "Heavy top-level modules the command imports (from `-X importtime`)."
    code = f'import sys; sys.argv = {argv[:1] + argv[1:]!r}; from reveal_kit.cli.main import main; main()'
    p = subprocess.run([sys.executable, '-X', 'importtime', '-c', code], capture_output=True, text=True, env=env)
    mods = {ln.rsplit('|', 1)[-1].strip() for ln in p.stderr.splitlines() if ln.startswith('import time:')}
    return sorted(m for m in HEAVY if m in mods)


def prepare(work: Path, env: dict) -> dict[str, list[str]]:
    "Build a small memory once; the commands to time."
    vid = work / 'v.mp4'
    if not vid.exists():    # in a child, so that this process stays small (a child's ru_maxrss starts at ours)
        subprocess.run([sys.executable, '-c', 'import sys; from reveal_kit.testing.videos import make_test_video; '
                        'make_test_video(sys.argv[1], [(4, 1), (5, 2)], fps=5)', str(vid)], check=True, env=env)
    mem = work / 'mem'
    if not (mem / 'manifest.json').exists():
        p = subprocess.run(reveal_cmd() + ['memory', 'build', str(vid), '--out', str(mem), '--json'],
                           capture_output=True, text=True, env=env)
        if p.returncode: sys.exit(f"memory build failed:\n{p.stderr[-2000:]}")
    return {'help': ['--help'],
            'ask': ['ask', str(vid), '-q', 'What is shown first?', '-o', 'A. a red scene', '-o', 'B. a blue scene',
                    '--memory', str(mem), '--trace-dir', str(work / 'traces')],
            'memory build (reuse)': ['memory', 'build', str(vid), '--out', str(mem)],
            'memory show': ['memory', 'show', str(mem)],
            'backends check': ['backends', 'check'],
            **{f"{' '.join(p)} --help": p + ['--help'] for p in command_paths()}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--work', default=None, help='folder for the video and memory (default: a temporary folder)')
    ap.add_argument('--out', default=None, help='JSON output (default runs/bench/startup_bench.json)')
    a = ap.parse_args(argv)
    env = dict(os.environ, HF_HUB_OFFLINE='1')
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        cmds = prepare(work, env)
        rows = {}
        for name, args in cmds.items():
            runs = [timed(reveal_cmd() + args, env) for _ in range(a.repeats)]
            bad = [r for r in runs if r[2] not in (0, 1)]
            if bad: sys.exit(f"`reveal {' '.join(args)}` exited {bad[0][2]}:\n{bad[0][3]}")
            rows[name] = dict(wall_s=statistics.median(r[0] for r in runs), cpu_s=statistics.median(r[4] for r in runs),
                              peak_mb=statistics.median(r[1] for r in runs),
                              target_s=TARGETS.get(name, HELP_TARGET),
                              heavy_imports=heavy_imports(['reveal'] + args, env))
    out = dict(repeats=a.repeats, cpus=os.cpu_count(), load_average=os.getloadavg()[0], commands=rows)
    p = Path(a.out) if a.out else Path('runs') / 'bench' / 'startup_bench.json'
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(out, indent=1))
    print(f"median of {a.repeats} fresh processes; {os.cpu_count()} CPUs, load {out['load_average']:.1f} "
          "(on a busy machine, CPU seconds are closer to what a quiet one takes)")
    w = max(len(k) for k in rows)
    print(f"{'command':{w}} {'wall s':>7} {'cpu s':>6} {'target':>7} {'ok':>3} {'peak MB':>8}  heavy imports")
    for k, r in rows.items():
        ok = 'yes' if r['wall_s'] <= r['target_s'] else 'NO'
        print(f"{k:{w}} {r['wall_s']:7.2f} {r['cpu_s']:6.2f} {r['target_s']:7.1f} {ok:>3} {r['peak_mb']:8.0f}  "
              + (', '.join(r['heavy_imports']) or '-'))
    print(f"written {p}")
    return out


if __name__ == '__main__':
    main()
