"""Offline-memory throughput benchmark: measured, not asserted.

For generated 10-minute and 60-minute 640x360 H.264 videos (textured scenes of 3-25 s, 25 fps; the 60-minute one is
six remuxed copies of the 10-minute one, which costs no encoding) it measures:
bare 1-fps decode (the dense strategy the pipeline picks: PyAV decode-all), the full stage-1 pipeline
(decode + quality filter + image embedding + adaptive segmentation, streamed), their ratio (target <= 1.5x with the
offline embedders), L1 count and mean length, peak RSS of the process, and the offline perceptual captioner's time
per segment (frame cutting + OCR + visual facts) on a sample of segments. Bare decode is the best of two runs of the
strategy the pipeline uses. With --strategies it also times OpenCV grab/retrieve and pure per-sample seeking on the
first video (the choice `reveal_kit.video.frames.choose_strategy` makes, explained in nbs/10_video.frames.ipynb).
With --full it also times a complete `reveal memory build` of each video in a fresh process (start-up included: every
L1 caption, L2/L3, both channels; target <= 60 s for 60 minutes on 2 quiet cores) with its stage timings
and the CPU seconds it used, and prints the machine's load average beside it (other work on the machine
slows every wall-clock figure; compare builds on a busy machine by their CPU seconds). The offline
captioner reads each L1 segment while stage 1 is still decoding (`ReadAhead`), so the build's 'segments'
time includes the readings that ran beside it, and its 'captions' time is what was left after stage 1.

Each video is measured in a fresh subprocess so peak RSS is per video.
Usage:  python benchmarks/memory_bench.py [--minutes 10 60] [--strategies] [--transitions] [--caption-sample 30]
        [--full] [--out runs/bench]
"""
import argparse, json, math, os, resource, subprocess, sys, time
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')


def make_video(path: Path, minutes: float, fps: int = 25, seed: int = 0) -> Path:
    "A long textured video: scenes of 3-25 s (random seeds), some with on-screen text."
    import numpy as np
    from reveal_kit.testing.videos import make_test_video
    if path.exists(): return path
    rng = np.random.default_rng(seed)
    scenes, total = [], 0.0
    while total < minutes * 60:
        L = float(min(rng.integers(3, 26), minutes * 60 - total))
        plain = rng.random() > 0.2                                # a fifth of the scenes carry a sign
        sc = (L, int(rng.integers(1, 10**6))) if plain else (L, int(rng.integers(1, 10**6)), f'SIGN {len(scenes)}')
        scenes.append(sc)
        total += L
    tmp = path.with_suffix('.tmp.mp4')
    make_test_video(tmp, scenes, fps=fps, size=(640, 360), preset='ultrafast')
    path.with_suffix('.cuts.json').write_text(json.dumps(list(np.cumsum([s[0] for s in scenes])[:-1].tolist())))
    tmp.rename(path)
    return path


def recall(found, truth, tol: float = 1.0) -> float:
    "Fraction of true cuts with a segment boundary within +-tol s."
    return round(sum(any(abs(f - t) <= tol for f in found) for t in truth) / max(1, len(truth)), 3)


TRANSITION_TOL_S = 1.0


def transition_recall(out: Path, n_each: int = 12, seed: int = 2) -> dict:
    """Per-transition-kind boundary recall/precision (+-TRANSITION_TOL_S, anywhere in a black run counts) and L1 count
    on one NTSC (30000/1001 fps) 320x180 video of camera-filmed scenes (pan, zoom, jolts with motion blur, noise; every
    third scene shares its predecessor's colours) joined by `n_each` hard cuts, black gaps (0.3-2.5 s), fades through
    black and dissolves, through the pipeline's own stage 1 (decode, quality filter, image embedding, segmentation)."""
    from reveal_kit.core import Config
    from reveal_kit.video.frames import probe_video
    from reveal_kit.retrieval.choice import get_image_embedder
    from reveal_kit.memory.build import _segment_pass
    from reveal_kit.testing.media import make_transition_video, transition_mix, transition_truth, match_boundaries
    scenes, trans = transition_mix(n_each, seed)
    v = out / f'transitions_{n_each}x4_seed{seed}.mp4'
    if not v.exists(): make_transition_video(v, scenes, trans, size=(320, 180), seed=seed)
    segs, rep = _segment_pass(v, probe_video(v), Config(), get_image_embedder(), progress=False)
    res = match_boundaries([s.t_start for s in segs[1:]], transition_truth(scenes, trans), tol=TRANSITION_TOL_S)
    res['all'].update(n_l1=len(segs), n_scenes=len(scenes), n_kept=rep.n_kept, n_frames=rep.n_frames)
    return res


def concat_copies(src: Path, dst: Path, n: int) -> Path:
    "`n` back-to-back copies of `src` by remuxing packets with shifted timestamps (no re-encoding)."
    import av
    if dst.exists(): return dst
    tmp = dst.with_suffix('.tmp.mp4')
    with av.open(str(src)) as c0:
        s0 = c0.streams.video[0]
        span = max(p.pts + (p.duration or 0) for p in c0.demux(s0) if p.pts is not None)
    with av.open(str(tmp), 'w') as out:
        with av.open(str(src)) as c:
            so = out.add_stream_from_template(c.streams.video[0])
        for k in range(n):
            with av.open(str(src)) as c:
                s = c.streams.video[0]
                for p in c.demux(s):
                    if p.dts is None: continue
                    p.pts += k * span
                    p.dts += k * span
                    p.stream = so
                    out.mux(p)
    tmp.rename(dst)
    return dst


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_one(video: Path, caption_sample: int, strategies: bool) -> dict:
    from reveal_kit.core import Config
    import numpy as np
    from reveal_kit.video.frames import probe_video, iter_frames, iter_frames_at, choose_strategy, read_frames_at
    from reveal_kit.retrieval.choice import get_image_embedder
    from reveal_kit.memory.build import _segment_pass, _caption_times
    from reveal_kit.video.captioning import PerceptualCaptioner, get_ocr
    cfg = Config()
    info = probe_video(video)
    ie = get_image_embedder()
    ie.encode([np.zeros((360, 640, 3), 'uint8')])                 # load the models outside the timings
    get_ocr()
    res = dict(video=video.name, minutes=round(info.duration / 60, 1), native_fps=info.fps, image_embedder=ie.model_id)
    open(video, 'rb').read()                                      # warm the page cache for the first timing
    def timed(strategy):
        t = time.time()
        n = sum(1 for _ in iter_frames(video, cfg.fps, strategy=strategy, info=info))
        return time.time() - t, n
    dense = choose_strategy(math.ceil(info.duration * cfg.fps), info.n_frames)
    runs = [timed(dense) for _ in range(2)]
    res.update(strategy=dense, decode_s=round(min(r[0] for r in runs), 2), n_samples=runs[0][1])
    if strategies:
        res['grab_s'] = round(min(timed('grab')[0] for _ in range(2)), 2)
        times = [k / cfg.fps for k in range(res['n_samples'])]
        t = time.time()
        sum(1 for _ in iter_frames_at(video, times, None, forward_s=0))
        res['seek_each_s'] = round(time.time() - t, 2)
    t = time.time()
    segs, rep = _segment_pass(video, info, cfg, ie, progress=False)
    res['pipeline_s'] = round(time.time() - t, 2)
    res['ratio'] = round(res['pipeline_s'] / res['decode_s'], 2)
    res.update(n_kept=rep.n_kept, n_frames=rep.n_frames, n_l1=len(segs), mean_l1_s=round(info.duration / len(segs), 2))
    cuts = video.with_suffix('.cuts.json')
    if cuts.exists(): res['boundary_recall_1s'] = recall([s.t_start for s in segs[1:]], json.loads(cuts.read_text()))
    pc = PerceptualCaptioner()
    step = max(1, len(segs) // caption_sample)
    sample = segs[::step][:caption_sample]
    t = time.time()
    for s in sample:
        frs = [f.rgb for f in read_frames_at(video, _caption_times(s, cfg.caption_frames), 640)]
        pc.caption(frs, s.t_start, s.t_end, '', s.boundary_sim)
    res['caption_s_per_segment'] = round((time.time() - t) / len(sample), 3)
    res['caption_sampled'] = len(sample)
    res['peak_rss_mb'] = round(peak_rss_mb())
    return res


def full_build(video: Path, out: Path) -> dict:
    "A complete `reveal memory build` of `video` in a fresh process: wall seconds, L1 count, stage timings, load."
    import shutil
    mem = out / f'full_{video.stem}'
    shutil.rmtree(mem, ignore_errors=True)
    exe = Path(sys.executable).parent / 'reveal'
    cmd = [str(exe)] if exe.exists() else [sys.executable, '-c', 'from reveal_kit.cli.main import main; main()']
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0, t = os.getloadavg()[0], time.time()
    p = subprocess.run(cmd + ['memory', 'build', str(video), '--out', str(mem), '--json'], capture_output=True, text=True)
    if p.returncode: raise SystemExit(f"memory build failed:\n{p.stderr[-2000:]}")
    wall, man = time.time() - t, json.loads((mem / 'manifest.json').read_text())
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime
    n = man['counts']['n_l1']
    return dict(full_build_s=round(wall, 1), full_cpu_s=round(cpu, 1), full_s_per_l1=round(wall / n, 3), full_n_l1=n,
                full_timings=man['timings'], load_before=round(load0, 1), load_after=round(os.getloadavg()[0], 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--minutes', type=float, nargs='+', default=[10, 60])
    ap.add_argument('--out', default='runs/bench')
    ap.add_argument('--caption-sample', type=int, default=30)
    ap.add_argument('--strategies', action='store_true')
    ap.add_argument('--full', action='store_true', help='also time a complete memory build of each video')
    ap.add_argument('--transitions', action='store_true',
                    help='also measure boundary recall/precision per transition kind (cuts, black gaps, fades, dissolves)')
    ap.add_argument('--one', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print('RESULT ' + json.dumps(measure_one(Path(a.one), a.caption_sample, a.strategies)))
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    base = out / 'bench_10min_360p.mp4'
    for m in a.minutes:
        v = out / f'bench_{int(m)}min_360p.mp4'
        t = time.time()
        if m > 10 and m % 10 == 0:                                # long videos: 10-min blocks remuxed
            make_video(base, 10)
            concat_copies(base, v, int(m // 10))
        else:
            make_video(v, m)
        print(f'# video {v} ready ({time.time() - t:.0f}s)', file=sys.stderr)
        cmd = [sys.executable, __file__, '--one', str(v), '--caption-sample', str(a.caption_sample)]
        if a.strategies and m == a.minutes[0]: cmd.append('--strategies')
        p = subprocess.run(cmd, capture_output=True, text=True)
        line = [l for l in p.stdout.splitlines() if l.startswith('RESULT ')]
        if not line:
            print(p.stdout, p.stderr, file=sys.stderr)
            raise SystemExit(f'measurement failed for {v}')
        rows.append(json.loads(line[0][7:]))
        if a.full: rows[-1].update(full_build(v, out))
        print(json.dumps(rows[-1]), file=sys.stderr)
    (out / 'memory_bench.json').write_text(json.dumps(rows, indent=1))
    print('| video | bare decode 1 fps (s) | decode+filter+embed+segment (s) | ratio | L1 | mean L1 (s) '
          '| peak RSS (MB) | offline caption (s/segment) |')
    print('|---|---|---|---|---|---|---|---|')
    for r in rows:
        print(f"| {r['minutes']} min 360p | {r['decode_s']} | {r['pipeline_s']} | {r['ratio']}x | {r['n_l1']} "
              f"| {r['mean_l1_s']} | {r['peak_rss_mb']} | {r['caption_s_per_segment']} |")
    for r in rows:
        if 'full_build_s' in r:
            t = r['full_timings']
            print(f"\ncomplete memory of {r['minutes']} min ({r['full_n_l1']} L1, L2/L3, both channels, start-up "
                  f"included): {r['full_build_s']} s = {r['full_s_per_l1']} s per L1, {r['full_cpu_s']} CPU s (segments {t.get('segment_s')} s, "
                  f"captions after stage 1 {t.get('caption_s')} s, summaries {t.get('summary_s')} s, text vectors "
                  f"{t.get('text_embed_s')} s); load average {r['load_before']} before, {r['load_after']} after")
    for r in rows:
        if 'seek_each_s' in r:
            print(f"\nDecode strategies, {r['minutes']} min ({r['n_samples']} samples at 1 fps): "
                  f"PyAV decode-all {r['decode_s']} s, "
                  f"OpenCV grab/retrieve {r['grab_s']} s, seek to each sample {r['seek_each_s']} s")
    for r in rows:
        print(f"\n{r['minutes']} min: kept {r['n_kept']}/{r['n_frames']} frames, "
              f"boundary recall (+-1 s) {r.get('boundary_recall_1s')}")
    if a.transitions:
        tr = transition_recall(out)
        print(f"\ntransitions (boundary within +-{TRANSITION_TOL_S:g} s; anywhere in a black run counts):")
        for kind, t in tr.items():
            print(f"  {kind:9s} recall {t['recall']:.3f} ({t['n']} true)  precision {t['precision']:.3f} "
                  f"({t['found']} found)")
        t = tr['all']
        print(f"  L1 segments {t['n_l1']} for {t['n_scenes']} scenes; kept {t['n_kept']}/{t['n_frames']} frames")
    print(f"\nimage embedder: {rows[0]['image_embedder']}; CPU cores: {os.cpu_count()}")


if __name__ == '__main__':
    main()
