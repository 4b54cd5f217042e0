"""FrameInspect's offline reading with and without the per-video reading memo (`pace.inspect.ReadingMemo`).

Replays the FrameInspect calls recorded in the traces of a finished `dvd` run of the PACE benchmark (default: the
long split, `benchmarks/pace_bench.py --split long`) twice per call: cold (an empty in-memory memo: frames decoded
and OCR'd) and warm (the memo beside the video's indexes), checks both give the same reading, and prints the seconds
per call. Run it after pace_bench.py; it changes nothing on disk except filling the memo.

    .venv/bin/python benchmarks/inspect_memo_bench.py [--out runs/bench/pace_long] [--calls 12]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')

from reveal_kit.core import Config, runs_dir
from reveal_kit.synth.bench import load_questions
from reveal_kit.pace.index import get_pace_dbs
from reveal_kit.pace.tools import ToolBox
from reveal_kit.pace.inspect import ReadingMemo


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', type=Path, default=runs_dir() / 'bench' / 'pace_long')
    ap.add_argument('--calls', type=int, default=12, help='FrameInspect calls to replay (first N traces)')
    a = ap.parse_args()
    traces = sorted((a.out / 'run_dvd' / 'traces').glob('*.json'))
    if not traces or not (a.out / 'data' / 'questions.jsonl').exists():
        print(f"error: no dvd traces under {a.out}; run benchmarks/pace_bench.py first", file=sys.stderr)
        sys.exit(2)
    qs = {q.qid: q for q in load_questions(a.out / 'data')}
    cold, warm, same = [], [], 0
    root = a.out / 'runs' / 'pace'
    for f in traces[:a.calls]:
        tr = json.loads(f.read_text())
        q = qs[f.name.split('__')[0]]
        step = next(s for s in tr['steps'] if s['tool'] == 'FrameInspect' and s['ok'])
        plain = get_pace_dbs(q.video_path, config=Config(), subtitles=q.subtitle_path, root=root)[0]
        tb = ToolBox(q, plain)
        tb._memo = ReadingMemo()                       # cold: nothing read before
        t = time.perf_counter(); c = tb.call('FrameInspect', step['arguments']); cold.append(time.perf_counter() - t)
        tb = ToolBox(q, plain)                         # warm: the video's memo
        tb.call('FrameInspect', step['arguments'])     # fills it if this range was never read
        t = time.perf_counter(); w = tb.call('FrameInspect', step['arguments']); warm.append(time.perf_counter() - t)
        same += c.summary == w.summary and w.data['readings_reused'] == len(step['arguments']['time_ranges_hhmmss'])
    print(f"{len(cold)} FrameInspect calls from {a.out / 'run_dvd'}: cold median {statistics.median(cold):.2f} s "
          f"(mean {statistics.mean(cold):.2f}), warm median {statistics.median(warm) * 1000:.1f} ms "
          f"(mean {statistics.mean(warm) * 1000:.1f}); identical readings, every range reused: {same}/{len(cold)}")


if __name__ == '__main__':
    main()
