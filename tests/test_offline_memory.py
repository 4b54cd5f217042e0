"""Integration and fault tests of the offline memory (REVEAL §3.1): bad inputs, resume after a real crash, reuse,
refusal of mismatched settings, segmentation accuracy, subtitle alignment, and the `reveal memory` commands."""
import json, os, random, signal, subprocess, sys, textwrap, time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import reveal_kit.video.captioning as cap
import reveal_kit.memory.build as mb
from reveal_kit.backends.chat import ScriptedModel
from reveal_kit.core import Config, MemoryBuildError
from reveal_kit.memory.build import build_memory, get_or_build_memory
from reveal_kit.cli.present import format_build_summary
from reveal_kit.memory.store import OfflineMemory, MemoryMismatchError, memory_dir_for, memory_models
from reveal_kit.cli.present import describe
from reveal_kit.testing.videos import make_test_video, write_srt, write_vtt, make_audio_only, make_empty, truncate_copy
from reveal_kit.testing.videos import make_faststart_truncated, scene_boundaries

SCENES = [(9, 1), (11, 2), (10, 3, 'LIBRARY'), (10, 4)]          # boundaries at 9, 20, 30 s; 40 s long
CFG = Config(l2_group=2)


@pytest.fixture(scope='module')
def video(tmp_path_factory):
    d = tmp_path_factory.mktemp('v')
    v = make_test_video(d / 'demo.mp4', SCENES, fps=4, size=(320, 180))
    srt = write_srt(d / 'demo.srt', [(10.5, 13.0, 'Where did you put the red umbrella?'),
                                     (31.0, 34.0, 'The train leaves at noon.')])
    return v, srt


def counting_vlm() -> ScriptedModel:
    "A meaningful scripted vision model whose `.calls` log every request."
    return ScriptedModel(lambda messages, schema, role: f'{role} text', model_id='counting-vlm')


def cli(*args):
    "Run `reveal ARGS...` in-process."
    from reveal_kit.cli.main import app
    return CliRunner().invoke(app, [str(a) for a in args])


# ---------------------------------------------------------------- bad inputs: one-line errors, nothing half-written
def _bad_inputs(d: Path, v: Path):
    (d / 'junk.mp4').write_bytes(random.Random(0).randbytes(4000))  # fixed: some random bytes probe as subtitles
    return {'missing': (d / 'missing.mp4', 'video not found'),
            'zero-length': (make_empty(d / 'empty.mp4'), 'empty video file'),
            'audio-only': (make_audio_only(d / 'tone.m4a'), 'no video stream'),
            'truncated': (truncate_copy(v, d / 'cut.mp4', 0.4), 'cannot open video'),
            'truncated-faststart': (make_faststart_truncated(d / 'cutfs.mp4'), 'truncated video'),
            'unreadable': (d / 'junk.mp4', 'cannot open video'),
            'directory': (d, 'directory')}


BAD_KINDS = ['missing', 'zero-length', 'audio-only', 'truncated', 'truncated-faststart', 'unreadable', 'directory']


@pytest.mark.parametrize('kind', BAD_KINDS)
def test_bad_video_one_line_error(tmp_path, video, kind):
    bad, why = _bad_inputs(tmp_path, video[0])[kind]
    with pytest.raises(MemoryBuildError) as e:
        OfflineMemory.build(bad, tmp_path / 'mem', CFG, progress=False)
    msg = str(e.value)
    assert why in msg and '\n' not in msg
    assert not (tmp_path / 'mem' / 'manifest.json').exists()


SUBTITLE_JUNK = ['just some words\n', 'WEBVTT\n\n00:00:xx --> garbage\nhello\n', '1\n00:00:01,000 --> 00:00:02\n']


@pytest.mark.parametrize('content', SUBTITLE_JUNK)
def test_malformed_subtitles(tmp_path, video, content):
    bad = tmp_path / 'bad.srt'
    bad.write_text(content)
    with pytest.raises(MemoryBuildError, match='malformed subtitle file'):
        OfflineMemory.build(video[0], tmp_path / 'mem', CFG, subtitles=bad, progress=False)
    assert not (tmp_path / 'mem').exists()                        # validated before anything is written


def test_all_frames_fail_filter_is_a_documented_fallback(tmp_path):
    v = make_test_video(tmp_path / 'dark.mp4', [(8, 1)], fps=2, dark=[(0, 8)])
    with pytest.warns(UserWarning, match='failed the quality filter'):
        m = OfflineMemory.build(v, tmp_path / 'mem', CFG, progress=False)
    assert m.manifest['quality']['rejected'] == {'dark': 8} and 'unfiltered' in m.manifest['quality']['fallback']
    assert m.level(1) and m.level(1)[0].t_start == 0 and m.level(1)[-1].t_end == pytest.approx(8, abs=0.2)


# ---------------------------------------------------------------- the memory itself
def test_segments_subtitles_levels(tmp_path, video):
    v, srt = video
    m = OfflineMemory.build(v, tmp_path / 'mem', CFG, subtitles=srt, progress=False)
    starts = [it.t_start for it in m.level(1)]
    assert len(starts) == 4 and all(abs(a - b) <= 1.0 for a, b in zip(starts[1:], scene_boundaries(SCENES)))
    subs = [it.meta['subtitles'] for it in m.level(1)]
    assert subs == ['', 'Where did you put the red umbrella?', '', 'The train leaves at noon.']
    assert (len(m.level(2)), len(m.level(3))) == (2, 1)
    assert m.level(2)[0].children == ['L1_0000', 'L1_0001'] and m.level(3)[0].children == ['L2_0000', 'L2_0001']
    c = m.manifest
    assert {'video_sha256', 'duration', 'config_hash', 'models', 'kit_version', 'counts', 'captioner',
            'memory_config'} <= set(c)
    assert c['captioner'] == 'offline-perceptual' and c['counts']['n_frames'] == 40
    hits = m.search_text('red umbrella', k={1: 2, 2: 1, 3: 1})
    assert [h.level for h in hits] == [1, 1, 2, 3] and hits[0].item.item_id == 'L1_0001'
    assert all(h.t_end > h.t_start for h in hits)
    fr = m.frames('L1_0002', 2)
    assert len(fr) == 2 and fr[0].ndim == 3


def test_short_video_gets_one_l2_and_l3(tmp_path):
    v = make_test_video(tmp_path / 's.mp4', [(3, 1)], fps=4)
    m = OfflineMemory.build(v, tmp_path / 'mem', Config(), progress=False)
    assert (len(m.level(1)), len(m.level(2)), len(m.level(3))) == (1, 1, 1)


def test_fixed_chunking(tmp_path, video):
    m = OfflineMemory.build(video[0], tmp_path / 'mem', CFG.replace(chunking='fixed'), progress=False)
    assert [(it.t_start, it.t_end) for it in m.level(1)] == [(0, 10), (10, 20), (20, 30), (30, 40)]


def test_static_scene_respects_max_length(tmp_path):
    v = make_test_video(tmp_path / 'static.mp4', [(75, 5)], fps=1)
    m = OfflineMemory.build(v, tmp_path / 'mem', Config(), progress=False)
    assert len(m.level(1)) >= 3 and max(it.duration for it in m.level(1)) <= 30.0


# ---------------------------------------------------------------- persistence: reuse, refusal, load without model calls
def test_reuse_refuse_rebuild(tmp_path, video):
    v, srt = video
    model = counting_vlm()
    m = OfflineMemory.build(v, tmp_path / 'mem', CFG, chat_model=model, subtitles=srt, progress=False)
    n = len(model.calls)
    assert n == 4 + 2 + 1 and m.manifest['captioner'] == 'model:counting-vlm'
    again = OfflineMemory.build(v, tmp_path / 'mem', CFG.replace(tau=0.3, max_rounds=5), chat_model=model,
                                subtitles=srt, progress=False)
    assert len(model.calls) == n and again.manifest['created'] == m.manifest['created']     # reused, no call
    loaded = OfflineMemory.load(tmp_path / 'mem', CFG)
    assert len(model.calls) == n and len(loaded.items) == len(m.items)
    with pytest.raises(MemoryMismatchError, match='theta'):
        OfflineMemory.build(v, tmp_path / 'mem', CFG.replace(theta=0.5), chat_model=model, subtitles=srt,
                            progress=False)
    with pytest.raises(MemoryMismatchError, match='captioner'):
        OfflineMemory.build(v, tmp_path / 'mem', CFG, chat_model=None, subtitles=srt, progress=False)
    with pytest.raises(MemoryMismatchError, match='different subtitles'):
        OfflineMemory.build(v, tmp_path / 'mem', CFG, chat_model=model, progress=False)
    with pytest.raises(MemoryMismatchError, match='theta'):
        OfflineMemory.load(tmp_path / 'mem', CFG.replace(theta=0.5))
    r = OfflineMemory.build(v, tmp_path / 'mem', CFG.replace(theta=0.5), subtitles=srt, progress=False,
                            rebuild=True)
    assert r.manifest['memory_config']['theta'] == 0.5 and r.manifest['captioner'] == 'offline-perceptual'


def test_get_or_build_memory_reuses(tmp_path, video):
    model = counting_vlm()
    a = get_or_build_memory(video[0], CFG, chat_model=model, root=tmp_path)
    n = len(model.calls)
    b = get_or_build_memory(video[0], CFG.replace(tau=0.9), chat_model=model, root=tmp_path)
    assert a.path == b.path and len(model.calls) == n
    assert a.path == memory_dir_for(video[0], CFG, memory_models(model), root=tmp_path)
    c = get_or_build_memory(video[0], CFG.replace(theta=0.7), chat_model=model, root=tmp_path)
    assert c.path != a.path


def test_half_built_memory_never_loads(tmp_path, video, monkeypatch):
    def boom(*a, **k): raise RuntimeError('disk full')
    monkeypatch.setattr(mb, '_summary_stage', boom)
    with pytest.raises(RuntimeError):
        OfflineMemory.build(video[0], tmp_path / 'mem', CFG, progress=False)
    with pytest.raises(MemoryBuildError, match='unfinished build'):
        OfflineMemory.load(tmp_path / 'mem')


# ---------------------------------------------------------------- resume after a real crash (SIGKILL mid-captioning)
CHILD = textwrap.dedent('''
    import sys, time
    from reveal_kit.core import Config
    from reveal_kit.memory.store import OfflineMemory
    import reveal_kit.memory.build                      # adds OfflineMemory.build
    import reveal_kit.video.captioning as cap
    orig = cap.PerceptualCaptioner.caption
    def slow(self, *a, **k):
        time.sleep(0.4)
        return orig(self, *a, **k)
    cap.PerceptualCaptioner.caption = slow
    OfflineMemory.build(sys.argv[1], sys.argv[2], Config(fps=2, l2_group=2, max_segment_s=4, min_segment_s=2),
                        progress=False)
''')


def test_resume_after_kill(tmp_path, monkeypatch):
    v = make_test_video(tmp_path / 'v.mp4', [(12, 1), (12, 2)], fps=4)
    out = tmp_path / 'mem'
    p = subprocess.Popen([sys.executable, '-c', CHILD, str(v), str(out)], env=dict(os.environ, HF_HUB_OFFLINE='1'))
    l1 = out / 'l1.jsonl'
    t0 = time.time()
    while time.time() - t0 < 120 and p.poll() is None:
        if l1.exists() and l1.read_text().count('\n') >= 2: break
        time.sleep(0.05)
    assert p.poll() is None, 'build finished before it could be killed'
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    done = l1.read_text().count('\n')
    assert not (out / 'manifest.json').exists() and (out / 'segments.json').exists()
    with pytest.raises(MemoryBuildError, match='unfinished build'):
        OfflineMemory.load(out)
    calls = []
    orig = cap.PerceptualCaptioner.caption
    monkeypatch.setattr(cap.PerceptualCaptioner, 'caption',
                        lambda self, *a, **k: calls.append(a[1]) or orig(self, *a, **k))
    monkeypatch.setattr(mb, '_segment_pass', lambda *a, **k: pytest.fail('stage 1 was redone'))
    m = OfflineMemory.build(v, out, Config(fps=2, l2_group=2, max_segment_s=4, min_segment_s=2), progress=False)
    n_l1 = len(m.level(1))
    assert n_l1 == 6 and len(calls) == n_l1 - done                # only the unfinished captions were made
    assert sorted(calls) == [it.t_start for it in m.level(1)][done:]
    assert len({it.item_id for it in m.level(1)}) == n_l1


# ---------------------------------------------------------------- what `reveal memory build | show` run
def test_build_memory_summary_reuse_and_describe(tmp_path, video):
    v, srt = video
    out, cfg = tmp_path / 'm', Config(l2_group=2)
    s = build_memory(v, out, cfg, subtitles=srt, chunking='fixed', progress=False)
    for k in ('n_frames', 'n_kept', 'n_l1', 'n_l2', 'n_l3', 'mean_l1_seconds', 'seconds', 'memory_dir'):
        assert k in s
    assert (s['n_l1'], s['mean_l1_seconds'], s['reused']) == (4, 10.0, False)
    assert json.loads(json.dumps(s)) == s                                     # `--json` prints it as is
    assert format_build_summary(s).startswith(f"built {out}: ") and 'L1=4 (mean 10.0s)' in format_build_summary(s)
    assert build_memory(v, out, cfg, subtitles=srt, chunking='fixed', progress=False)['reused'] is True
    with pytest.raises(MemoryMismatchError, match='rebuild'):
        build_memory(v, out, cfg, chunking='adaptive', progress=False)
    text = describe(OfflineMemory.load(out))
    assert 'L1       4 items' in text and 'red umbrella' in text
    with pytest.raises(MemoryBuildError, match='adaptive or fixed'):
        build_memory(v, tmp_path / 'x', cfg, chunking='scenes', progress=False)


def test_build_memory_default_out_dir(tmp_path, video, monkeypatch):
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))
    d = Path(build_memory(video[0], progress=False)['memory_dir'])
    assert d.parent == tmp_path / 'runs' / 'memories' and d.name.startswith('demo-') and (d / 'manifest.json').exists()


def test_cli_memory_errors_are_one_line_exit_2(tmp_path, video):
    "The CLI maps every MemoryBuildError to one line on stderr and exit status 2."
    bad, why = _bad_inputs(tmp_path, video[0])['audio-only']
    r = cli('memory', 'build', bad, '--out', tmp_path / 'mem')
    assert r.exit_code == 2 and why in r.output and r.output.strip().count('\n') == 0, r.output
    junk = tmp_path / 'bad.srt'
    junk.write_text(SUBTITLE_JUNK[0])
    r = cli('memory', 'build', video[0], '--subtitles', junk, '--out', tmp_path / 'm')
    assert r.exit_code == 2 and 'malformed subtitle file' in r.output
    (tmp_path / 'empty').mkdir()
    r = cli('memory', 'show', tmp_path / 'empty')
    assert r.exit_code == 2 and 'not a complete memory' in r.output, r.output


def test_cli_memory_build_json_and_show(tmp_path, video):
    v, srt = video
    r = cli('memory', 'build', v, '--subtitles', srt, '--out', tmp_path / 'm', '--json', '--chunking', 'fixed',
            '--set', 'l2_group=2')
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])['n_l1'] == 4
    r = cli('memory', 'show', tmp_path / 'm')
    assert r.exit_code == 0 and 'L1       4 items' in r.stdout


def test_vtt_subtitles(tmp_path, video):
    vtt = write_vtt(tmp_path / 's.vtt', [(21.0, 24.0, 'Look at the library sign.')])
    m = OfflineMemory.build(video[0], tmp_path / 'mem', CFG, subtitles=vtt, progress=False)
    assert [bool(it.meta['subtitles']) for it in m.level(1)] == [False, False, True, False]


def test_scripted_model_path(tmp_path, video):
    sm = ScriptedModel(lambda messages, schema, role: f'{role} text', model_id='scripted-vlm')
    m = OfflineMemory.build(video[0], tmp_path / 'mem', CFG, chat_model=sm, subtitles=video[1], progress=False)
    assert [c['role'] for c in sm.calls] == ['caption'] * 4 + ['summarize_l2'] * 2 + ['summarize_l3']
    assert m.manifest['captioner'] == 'model:scripted-vlm' and m.level(1)[0].narrative.endswith('caption text')
    assert 'red umbrella' in str(sm.calls[1]['messages'])                          # aligned subtitles reach the prompt
    weak = ScriptedModel(lambda messages, schema, role: 'x', model_id='weak', meaningful=False)
    w = OfflineMemory.build(video[0], tmp_path / 'mem2', CFG, chat_model=weak, progress=False)
    assert w.manifest['captioner'] == 'offline-perceptual' and not weak.calls      # not meaningful: offline roles


# ---------------------------------------------------------------- real-world videos and damaged memories
from reveal_kit.testing.media import make_mkv_with_subtitles, make_raw_h264, make_transition_video
from reveal_kit.testing.media import transition_mix, transition_truth, match_boundaries


def test_mkv_subtitle_track_outlasting_video_builds_and_warns_about_late_cues(tmp_path):
    v = make_mkv_with_subtitles(tmp_path / 'rip.mkv', [(4, 1), (4, 2)], cues=[(1, 2, 'hi'), (9, 11, 'credits')])
    with pytest.warns(UserWarning, match='run past the video'):
        m = OfflineMemory.build(v, tmp_path / 'mem', CFG, subtitles=v.with_suffix('.srt'), progress=False)
    assert m.level(1)[-1].t_end == pytest.approx(8.0, abs=0.15)


def test_raw_h264_stream_builds(tmp_path):
    m = OfflineMemory.build(make_raw_h264(tmp_path / 'r.h264', [(5, 1), (5, 2)]), tmp_path / 'mem', CFG,
                            progress=False)
    assert m.manifest['counts']['n_frames'] == 10 and m.level(1)


def test_directory_as_video_says_directory(tmp_path):
    "A folder is read as time-stamped clips (EgoLife); one without any says so in one line."
    with pytest.raises(MemoryBuildError, match=r'folder of time-stamped clips .*the directory .* holds no \.mp4 clips'):
        build_memory(tmp_path, progress=False)


def test_transitions_one_boundary_each_in_the_transition(tmp_path):
    """Camera-filmed NTSC scenes (pan, zoom, jolts, noise; some with the same colours) joined by hard cuts, black gaps
    of 0.3-2.5 s, fades through black and dissolves: cuts and black gaps are found within +-1 s (anywhere in a black
    run counts), and a fade or a dissolve gives one boundary, not two or three."""
    from reveal_kit.retrieval.choice import get_image_embedder
    from reveal_kit.video.frames import probe_video
    scenes, trans = transition_mix(3, seed=3)
    v = make_transition_video(tmp_path / 'tr.mp4', scenes, trans)
    segs, _ = mb._segment_pass(v, probe_video(v), CFG, get_image_embedder(), progress=False)
    m = match_boundaries([s.t_start for s in segs[1:]], transition_truth(scenes, trans), tol=1.0)
    assert m['cut']['recall'] >= 0.9 and m['black']['recall'] >= 0.9, m
    assert m['all']['precision'] >= 0.85 and len(segs) <= len(scenes) + 1, (len(segs), m)


def test_fixed_chunking_no_sliver_and_frames_everywhere(tmp_path):
    v = make_test_video(tmp_path / 's.mp4', [(10, 1), (10.2, 2)], fps=5)
    m = OfflineMemory.build(v, tmp_path / 'mem', CFG.replace(chunking='fixed'), progress=False)
    assert min(it.duration for it in m.level(1)) >= CFG.min_segment_s
    assert all(it.meta['n_frames'] > 0 for it in m.level(1))


def test_fallback_reported_the_same_everywhere(tmp_path):
    v = make_test_video(tmp_path / 'dark.mp4', [(6, 1)], fps=2, dark=[(0, 6)])
    with pytest.warns(UserWarning):
        s = build_memory(v, tmp_path / 'mem', CFG, progress=False)
    assert 'unfiltered' in s['fallback'] and 'FALLBACK' in s['quality'] and 'FALLBACK' in format_build_summary(s)
    text = describe(OfflineMemory.load(tmp_path / 'mem'))
    assert '6/6 frames used' in text and 'FALLBACK' in text


@pytest.fixture
def built(tmp_path, video):
    OfflineMemory.build(video[0], tmp_path / 'mem', CFG, progress=False)
    return tmp_path / 'mem'


def test_show_never_writes_and_build_repairs_keeping_valid_lines(built, video):
    l1 = built / 'l1.jsonl'
    lines = l1.read_text().splitlines()
    lines[1] = lines[1][:20]
    l1.write_text('\n'.join(lines) + '\n')
    before = l1.read_bytes()
    with pytest.warns(UserWarning), pytest.raises(MemoryBuildError, match='build it again to repair'):
        OfflineMemory.load(built)
    assert l1.read_bytes() == before                                   # a read command never writes
    r = cli('memory', 'show', built)
    assert r.exit_code == 2 and l1.read_bytes() == before
    with pytest.warns(UserWarning, match='repairing'):
        m = OfflineMemory.build(video[0], built, CFG, progress=False)
    assert len(m.level(1)) == 4 and [json.loads(x)['item_id'] for x in l1.read_text().splitlines()][:3] == \
        ['L1_0000', 'L1_0002', 'L1_0003']                               # valid lines kept, the damaged one redone


def test_truncated_manifest_named_and_rebuild_replaces_it(built, video):
    man = built / 'manifest.json'
    man.write_text(man.read_text()[:50])
    with pytest.raises(MemoryBuildError, match='manifest.json'):
        OfflineMemory.load(built)
    with pytest.raises(MemoryBuildError, match='manifest.json'):
        OfflineMemory.build(video[0], built, CFG, progress=False)
    m = OfflineMemory.build(video[0], built, CFG, progress=False, rebuild=True)
    assert len(m.level(1)) == 4 and OfflineMemory.load(built)


@pytest.mark.parametrize('name', ['text_emb.npy', 'visual.npy', 'text_ids.json'])
def test_missing_or_misshapen_files_are_one_clear_error(built, name):
    (built / name).unlink()
    with pytest.raises(MemoryBuildError, match=name):
        OfflineMemory.load(built)
    if name.endswith('.npy'):
        np.save(built / name, np.zeros((2, 3), np.float32))
        with pytest.raises(MemoryBuildError, match='shape'):
            OfflineMemory.load(built)


def test_complete_memory_in_read_only_directory(built, video):
    if os.geteuid() == 0:
        pytest.skip('root ignores directory permissions')
    os.chmod(built, 0o555)
    try:
        m = OfflineMemory.build(video[0], built, CFG, progress=False)
        assert len(m.level(1)) == 4
    finally: os.chmod(built, 0o755)


def test_complete_memory_build_takes_no_lock(built, video, monkeypatch):
    monkeypatch.setattr(mb, 'locked_dir', lambda out: pytest.fail('a complete memory was locked for reading'))
    assert len(OfflineMemory.build(video[0], built, CFG, progress=False).level(1)) == 4


# ---------------------------------------------------------------- a folder of time-stamped clips (issue 21, item 5)

def _egolife_clips(root: Path, identity: str = 'A1_JAKE') -> Path:
    "An EgoLife-layout folder: three contiguous 6-s clips on day 1 (a scene runs across the first cut), one on day 2."
    clips = [('DAY1', '11150000', [(3, 1), (3, 2)]), ('DAY1', '11150600', [(3, 2), (3, 3)]),
             ('DAY1', '11151200', [(6, 4)]), ('DAY2', '09300000', [(3, 5), (3, 6)])]
    for day, hms, scenes in clips:
        make_test_video(root / identity / day / f'{day}_{identity}_{hms}.mp4', scenes, fps=4)
    return root / identity


def test_reveal_memory_build_reads_a_folder_of_clips_as_one_timeline(tmp_path):
    from reveal_kit.eval.loaders import egolife_seconds
    from reveal_kit.video.frames import read_frames_at
    folder = _egolife_clips(tmp_path)
    r = cli('memory', 'build', folder, '--out', tmp_path / 'mem', '--json', '--set', 'l2_group=2')
    assert r.exit_code == 0, r.output
    mem = OfflineMemory.load(tmp_path / 'mem')
    l1 = mem.level(1)
    day1, day2 = egolife_seconds('DAY1', '11150000'), egolife_seconds('DAY2', '09300000')
    assert l1[0].t_start == day1 and any(it.t_start == day2 for it in l1)          # seconds since DAY1 00:00
    assert not any(it.t_start < day1 + 18.5 < it.t_end for it in l1)                # none bridges the night
    assert all(it.meta['source'].startswith(('DAY1/DAY1_A1_JAKE_', 'DAY2/DAY2_A1_JAKE_')) for it in l1)
    start = lambda c: egolife_seconds(c.stem.split('_')[0], c.stem.split('_')[-1])
    clips = sorted(folder.rglob('*.mp4'), key=start)
    for it in l1:
        assert abs(it.meta['source_offset'] - (it.t_start - start(folder / it.meta['source']))) < 1e-6
        mid = (it.t_start + it.t_end) / 2
        own = [c for c in clips if start(c) <= mid][-1]                          # the clip that holds the moment
        assert (mem.frames(it, 1, None)[0] == read_frames_at(own, [mid - start(own)])[0].rgb).all(), it.item_id
    assert any(len(it.meta['sources']) == 2 for it in l1)                           # one scene, two clips
    assert mem.manifest['video_id'] == 'A1_JAKE' and mem.manifest['clips']['n_clips'] == 4


def test_egolife_and_ego_r1_questions_get_the_folder_memory_and_range_targets(tmp_path):
    from reveal_kit.eval.loaders import load_egolifeqa, load_egor1
    from reveal_kit.eval.loaders import egolife_seconds
    from reveal_kit.testing.annotation_files import write_fixture
    write_fixture('egolifeqa', tmp_path / 'el', videos=False)
    _egolife_clips(tmp_path / 'el')
    (q, *_), _ = load_egolifeqa(tmp_path / 'el')
    mem = get_or_build_memory(q.video_path, CFG, root=tmp_path / 'mems')
    assert mem.manifest['video_path'] == str((tmp_path / 'el' / 'A1_JAKE').resolve())
    assert mem.level(1)[0].t_start == egolife_seconds('DAY1', '11150000')
    (tmp_path / 'r1').mkdir()
    rec = dict(ID='7', identity='A1', question='What did I pick up?', choice_a='a cup', choice_b='a key', answer='B',
               query_time={'date': 'DAY2', 'time': '10000000'}, target_time='DAY1_11150200-DAY1_11150800')
    (tmp_path / 'r1' / 'Ego-R1-Bench.json').write_text(json.dumps([rec]))
    _egolife_clips(tmp_path / 'r1')
    (r1,), _ = load_egor1(tmp_path / 'r1')
    a, b = egolife_seconds('DAY1', '11150200'), egolife_seconds('DAY1', '11150800')
    assert r1.evidence_spans == [(a, b)] and r1.video_path == str(tmp_path / 'r1' / 'A1_JAKE')
    m1 = get_or_build_memory(r1.video_path, CFG, root=tmp_path / 'mems')
    hit = [it for it in m1.level(1) if it.t_start < b and it.t_end > a]
    assert {s[0] for it in hit for s in it.meta['sources']} == {'DAY1/DAY1_A1_JAKE_11150000.mp4',
                                                              'DAY1/DAY1_A1_JAKE_11150600.mp4'}   # the range's clips


def test_egolife_question_reads_only_the_footage_before_its_query_time(tmp_path):
    "Item 7: memory, retrieval and `direct` see nothing recorded after the question (unless before_query is off)."
    import dataclasses
    from reveal_kit.eval.baselines import direct
    from reveal_kit.eval.context import RunContext
    from reveal_kit.eval.loaders import egolife_seconds, load_egolifeqa
    from reveal_kit.testing.annotation_files import write_fixture
    write_fixture('egolifeqa', tmp_path / 'el', videos=False)
    _egolife_clips(tmp_path / 'el')
    (q, *_), _ = load_egolifeqa(tmp_path / 'el')
    t = egolife_seconds('DAY1', '11151000')                            # asked during day 1: day 2 is the future
    q = dataclasses.replace(q, meta=dict(q.meta, query_seconds=t))
    mem = get_or_build_memory(q.video_path, CFG, root=tmp_path / 'mems')
    for before, future in ((True, False), (False, True)):
        ctx = RunContext('egolifeqa', 'direct', tmp_path / f'run-{before}', CFG.replace(before_query=before),
                         backend='none')
        ctx._mems[(q.video_id, CFG.chunking)] = mem
        seen = ctx.memory(q)
        assert any(it.t_end > t for it in seen.items) == future
        hits = seen.search_text('a scene', k={1: 50, 2: 50, 3: 50})
        assert any(h.item.t_end > t for h in hits) == future
    cut = RunContext('egolifeqa', 'direct', tmp_path / 'run', CFG, backend='none')
    cut._mems[(q.video_id, CFG.chunking)] = mem
    assert cut.memory(q).duration == t and direct(q, cut.memory(q), None, CFG)['n_frames'] <= t - mem.level(1)[0].t_start


# ---------------------------------------------------------------- read ahead: the same memory as the plain path
@pytest.mark.parametrize('scenes', [[(7, 1), (8, 2, 'EXIT 42'), (9, 3), (6, 4, 'PLATFORM 9')], [(9, 5), (8, 6), (7, 7)]])
def test_read_ahead_builds_the_plain_memory(tmp_path, monkeypatch, scenes):
    "A build whose captioner reads segments while stage 1 decodes writes the bytes of one that decodes and reads later."
    v = make_test_video(tmp_path / 'v.mp4', scenes, fps=4, size=(640, 360))
    srt = write_srt(tmp_path / 'v.srt', [(2.0, 5.0, 'mind the gap'), (20.0, 24.0, 'platform nine')])
    taken = []
    orig_take = cap.ReadAhead.take
    monkeypatch.setattr(cap.ReadAhead, 'take', lambda self, s: taken.append(orig_take(self, s)) or taken[-1])
    OfflineMemory.build(v, tmp_path / 'ahead', CFG, subtitles=srt, progress=False)
    n_l1 = len(taken)
    assert n_l1 >= 3 and all(f is not None for f in taken)                 # every caption was read ahead
    class Off(cap.ReadAhead):
        def __init__(self, c, times=None, on=True): super().__init__(c, times, on=False)
    monkeypatch.setattr(mb, 'ReadAhead', Off)
    monkeypatch.setattr(cap.PerceptualCaptioner, 'workers', property(lambda self: 1))   # one segment at a time
    OfflineMemory.build(v, tmp_path / 'plain', CFG, subtitles=srt, progress=False)
    assert all(f is None for f in taken[n_l1:])                             # nothing read ahead
    for f in ('l1.jsonl', 'l2.jsonl', 'l3.jsonl', 'text_emb.npy', 'visual.npy'):
        assert (tmp_path / 'ahead' / f).read_bytes() == (tmp_path / 'plain' / f).read_bytes(), f
    assert ('"EXIT 42"' in (tmp_path / 'plain' / 'l1.jsonl').read_text()) == (len(scenes) == 4)
