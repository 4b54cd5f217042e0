"""Benchmark the synthetic benchmark generator (reveal_kit.synth.bench): time to script + render one video of each
length, file sizes, question counts.

    python benchmarks/synth_bench.py                       # 10 and 60 minutes at 640x360, 2 fps
    python benchmarks/synth_bench.py --minutes 10 --width 320 --height 180 --json out.json

Each length is generated as a one-video benchmark in a temporary folder (the `reveal synth` path, with writing the
SRT, timeline, questions and manifest included in the time). `seconds` is wall time, `cpu_s` the process's CPU time
(the encoder runs in-process with one thread), which is what to compare on a loaded machine.
"""
from __future__ import annotations
import argparse, json, os, platform, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reveal_kit.video.frames import iter_frames  # noqa: E402
from reveal_kit.synth.bench import generate_benchmark  # noqa: E402


def bench(minutes: float, size: tuple[int, int], fps: float, qpv: int) -> dict:
    "Generate one video of `minutes` and measure it."
    with tempfile.TemporaryDirectory() as d:
        t0, c0 = time.perf_counter(), time.process_time()
        man = generate_benchmark(d, minutes=minutes, videos=1, questions_per_video=qpv, seed=0, size=size, fps=fps,
                                 progress=False)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        mp4 = next((Path(d) / 'videos').glob('*.mp4'))
        t1 = time.perf_counter()
        n = sum(1 for _ in iter_frames(mp4, fps=fps, max_width=None))      # every frame, decoded to RGB
        dec = time.perf_counter() - t1
        v = man['videos'][0]
        return dict(minutes=minutes, size=list(size), fps=fps, codec=man['parameters']['codec'], seconds=round(dt, 1),
                    cpu_s=round(cpu, 1), render_s=v['render_s'], realtime_x=round(minutes * 60 / dt, 1),
                    mp4_mb=round(mp4.stat().st_size / 1e6, 2),
                    srt_kb=round((mp4.with_suffix('.srt')).stat().st_size / 1e3, 1), frames=n, decode_s=round(dec, 1),
                    scenes=v['n_scenes'], events=v['n_events'], questions=man['n_questions'],
                    counts=man['counts_by_type'])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--minutes', type=float, nargs='+', default=[10, 60])
    ap.add_argument('--width', type=int, default=640)
    ap.add_argument('--height', type=int, default=360)
    ap.add_argument('--fps', type=float, default=2.0)
    ap.add_argument('--questions-per-video', type=int, default=12)
    ap.add_argument('--json', type=Path)
    a = ap.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    rows = []
    for m in a.minutes:
        r = bench(m, (a.width, a.height), a.fps, a.questions_per_video)
        rows.append(r)
        print(json.dumps(r))
    if a.json: a.json.write_text(json.dumps(rows, indent=1))


if __name__ == '__main__':
    main()
