"""Integration tests of the generated benchmark (reveal_kit.synth.questions / synth_render / synth_bench, nbs/09*).

Determinism, validity (every gold answer recomputed here, independently, from the scripted timeline), evidence really
in the pixels (OCR) or the subtitles, and blind answerers (question + options only) near chance.
"""
from __future__ import annotations
import json, re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from reveal_kit.video.frames import iter_frames, read_frames_at
from reveal_kit.video.subtitles import load_subtitles
from reveal_kit.synth.bench import SPLITS, generate_benchmark, load_questions
from reveal_kit.synth.script import ACTIONS, ENTITIES, QTYPES

SMALL = dict(minutes=2, videos=1, questions_per_video=6, size=(320, 180), progress=False)


# ---------- helpers written independently of the generator ----------
def say(e: dict) -> str:
    "How the benchmark words an event (entity, 3rd-person verb, object)."
    return f"{ENTITIES[e['entity']][0]} {ACTIONS[e['action']][0]} the {e['obj']}"


def timelines(root: Path) -> dict[str, dict]:
    return {p.name.split('.')[0]: json.loads(p.read_text()) for p in (root / 'videos').glob('*.timeline.json')}


def recompute(q, tl: dict) -> str:
    "The gold option text, recomputed from the timeline alone."
    evs = sorted(tl['events'], key=lambda e: e['t_start'])
    t = q.meta['target']
    key = lambda e: (e['entity'], e['action'], e['obj'])
    tt = (t.get('entity'), t.get('action'), t.get('obj'))
    if q.qtype == 'counting':
        return str(sum(key(e) == tt for e in evs))
    if q.qtype == 'temporal_order':
        i = [k for k, e in enumerate(evs) if key(e) == tt]
        assert len(i) == 1
        return say(evs[i[0] + 1])
    if q.qtype == 'negation':
        shown = {say(e) for e in evs}
        absent = [o for o in q.options.values() if o not in shown]
        assert len(absent) == 1, absent
        return absent[0]
    if q.qtype == 'action':
        hits = {say(e) for e in evs if (e['entity'], e['obj']) == (tt[0], tt[2])}
        assert len(hits) == 1
        return hits.pop()
    if q.qtype == 'causal':
        hits = [e for e in evs if key(e) == tt]
        assert len(hits) == 1 and hits[0]['cause']
        return 'because ' + hits[0]['cause']
    if q.qtype == 'global':
        (top, n1), (_, n2) = Counter(e['entity'] for e in evs).most_common(2)
        assert n1 > n2
        return ENTITIES[top][0]
    raise AssertionError(q.qtype)


def words(s: str) -> set[str]:
    return set(re.findall(r'[a-z0-9]+', s.lower()))


def srt_cues(path: Path) -> list[tuple[float, float, str]]:
    return [(c.start, c.end, c.text) for c in load_subtitles(path)]


def all_frames(path) -> list[np.ndarray]:
    "Every frame of a generated (2 fps) video."
    return [f.rgb for f in iter_frames(path, fps=2.0, max_width=None)]


@pytest.fixture(scope='module')
def many(tmp_path_factory):
    "A benchmark of 24 ten-minute videos, scripted but not rendered (questions only: fast)."
    root = tmp_path_factory.mktemp('many')
    man = generate_benchmark(root, minutes=10, videos=24, questions_per_video=12, seed=5, split='dev', render=False,
                             progress=False)
    return root, man, load_questions(root)


# ---------- determinism ----------
def test_determinism(tmp_path):
    a = generate_benchmark(tmp_path / 'a', seed=3, **SMALL)
    b = generate_benchmark(tmp_path / 'b', seed=3, **SMALL)
    c = generate_benchmark(tmp_path / 'c', seed=4, **SMALL)
    qa, qb, qc = [(tmp_path / x / 'questions.jsonl').read_bytes() for x in 'abc']
    assert qa == qb and qa != qc
    va, vb, vc = [tmp_path / x / 'videos' / f'test-s{s}-000.mp4' for x, s in zip('abc', (3, 3, 4))]
    fa, fb, fc = all_frames(va), all_frames(vb), all_frames(vc)
    assert len(fa) == len(fb) == 240 and all(np.array_equal(x, y) for x, y in zip(fa, fb))
    assert not np.array_equal(fa[0], fc[0])
    assert a['files'] == b['files']                       # same checksums for every file


def test_parallel_workers_same_output(tmp_path):
    kw = dict(SMALL, minutes=1, videos=2)
    a = generate_benchmark(tmp_path / 'a', seed=8, workers=1, **kw)
    b = generate_benchmark(tmp_path / 'b', seed=8, workers=2, **kw)
    assert a['files'] == b['files'] and a['n_questions'] == b['n_questions']


def test_manifest_and_files(tmp_path):
    man = generate_benchmark(tmp_path, seed=1, **SMALL)
    root = tmp_path
    for name, info in man['files'].items():
        assert (root / name).stat().st_size == info['bytes'] > 0
    assert {'generator_version', 'seed', 'parameters', 'counts_by_type', 'letter_distribution', 'files'} <= set(man)
    qs = load_questions(root)
    assert len(qs) == man['n_questions'] >= 5
    assert all(Path(q.video_path).exists() and Path(q.subtitle_path).exists() for q in qs)
    raw = [json.loads(l) for l in (root / 'questions.jsonl').read_text().splitlines()]
    assert all(not Path(r['video_path']).is_absolute() for r in raw)


# ---------- validity ----------
def test_gold_recomputed_from_timeline(many):
    root, man, qs = many
    tls = timelines(root)
    assert len(qs) == man['n_questions'] >= 0.95 * 24 * 12
    for q in qs:
        assert q.options[q.answer] == recompute(q, tls[q.video_id]), (q.qid, q.qtype)


def test_spans_options_letters(many):
    root, man, qs = many
    tls = timelines(root)
    for q in qs:
        evs = {e['eid']: e for e in tls[q.video_id]['events']}
        assert 4 <= len(q.options) <= 5 and len(set(q.options.values())) == len(q.options)
        assert q.evidence_spans and len(q.cues) == len(q.evidence_spans) and all(c.strip() for c in q.cues)
        assert all(0 <= a < b <= q.duration for a, b in q.evidence_spans + q.distractor_spans)
        assert all(b - a >= 3.5 for a, b in q.evidence_spans)       # ≥ 3 samples at 1 fps
        assert not any(a < d and c < b for a, b in q.evidence_spans for c, d in q.distractor_spans)
        assert [tuple(evs[i][k] for k in ('t_start', 't_end')) for i in q.meta['evidence_events']] == q.evidence_spans
    for t in set(QTYPES) - {'global'}:      # every local type plants misleading spans
        assert np.mean([bool(q.distractor_spans) for q in qs if q.qtype == t]) > 0.9, t
    letters = Counter(q.answer for q in qs)
    assert all(letters[L] / len(qs) > 0.12 for L in 'ABCD') and max(letters.values()) / len(qs) < 0.4
    assert Counter(q.qtype for q in qs) == Counter({t: 24 * 2 for t in QTYPES})


def test_subtitle_rate(tmp_path):
    "More subtitles never change the questions; rate 1 mentions every event in the SRT."
    a = generate_benchmark(tmp_path / 'a', minutes=3, videos=1, seed=2, render=False, progress=False)
    b = generate_benchmark(tmp_path / 'b', minutes=3, videos=1, seed=2, render=False, progress=False, subtitle_rate=1.0)
    assert (tmp_path / 'a/questions.jsonl').read_bytes() == (tmp_path / 'b/questions.jsonl').read_bytes()
    tl = next(iter(timelines(tmp_path / 'b').values()))
    subs = srt_cues(tmp_path / 'b/videos/test-s2-000.srt')
    assert len(subs) == len(tl['events']) > len(srt_cues(tmp_path / 'a/videos/test-s2-000.srt'))


def test_splits_disjoint(tmp_path):
    ids, seeds = {}, {}
    for sp in SPLITS:
        man = generate_benchmark(tmp_path / sp, minutes=1, videos=3, questions_per_video=6, seed=0, split=sp,
                                 render=False, progress=False)
        ids[sp] = {v['video_id'] for v in man['videos']}
        seeds[sp] = {v['seed'] for v in man['videos']}
        assert all(i.startswith(sp + '-') for i in ids[sp])
    for a in SPLITS:
        for b in SPLITS:
            if a < b: assert not ids[a] & ids[b] and not seeds[a] & seeds[b]


# ---------- evidence in pixels or subtitles ----------
def test_cues_in_pixels_or_subtitles(tmp_path):
    from rapidocr_onnxruntime import RapidOCR
    generate_benchmark(tmp_path, minutes=2, videos=1, questions_per_video=6, seed=2, size=(640, 360), progress=False)
    qs = load_questions(tmp_path)
    subs = srt_cues(Path(qs[0].subtitle_path))
    sample = sorted(((a + b) / 2, (a, b), c) for q in qs for (a, b), c in list(zip(q.evidence_spans, q.cues))[:2])
    frames = read_frames_at(qs[0].video_path, [t for t, _, _ in sample])         # in time order, like `sample`
    eng = RapidOCR()
    by_ocr = by_any = 0
    for (_, (a, b), cue), f in zip(sample, frames):
        res, _ = eng(np.ascontiguousarray(f.rgb[..., ::-1]))
        ocr = words(' '.join(r[1] for r in res or []))
        sub = words(' '.join(t for s, e, t in subs if s < b and a < e))
        by_ocr += words(cue) <= ocr
        by_any += words(cue) <= ocr | sub
    assert by_any == len(sample) and by_ocr >= 0.9 * len(sample), (by_ocr, by_any, len(sample))


# ---------- blind answerers ----------
STOP = {'the', 'a', 'of', 'in', 'does', 'what', 'is', 'video', 'which', 'these'}


def blind_scores(qs) -> dict[str, float]:
    "Accuracy of answerers that see only the question and the options."
    tok = lambda s: words(s) - STOP
    strategies = {
        'longest': lambda q: max(q.options, key=lambda k: len(q.options[k])),
        'shortest': lambda q: min(q.options, key=lambda k: len(q.options[k])),
        'lexical_overlap': lambda q: max(q.options, key=lambda k: len(tok(q.options[k]) & tok(q.question))),
        'least_overlap': lambda q: min(q.options, key=lambda k: len(tok(q.options[k]) & tok(q.question))),
    }
    return {k: float(np.mean([f(q) == q.answer for q in qs])) for k, f in strategies.items()}


def assert_near_chance(qs, scores: dict) -> None:
    chance = float(np.mean([1 / len(q.options) for q in qs]))
    for k, v in scores.items():
        assert v < chance + 0.08, (k, v, chance)


def test_blind_answerers_near_chance(many):
    _, _, qs = many
    assert_near_chance(qs, blind_scores(qs))


@pytest.mark.slow
def test_blind_embedding_answerer_near_chance(many):
    "The kit's text embedder: pick the option most similar to the question."
    from reveal_kit.retrieval.choice import get_text_embedder
    _, _, qs = many
    enc = get_text_embedder('auto').encode
    texts = sorted({q.question for q in qs} | {o for q in qs for o in q.options.values()})
    vec = dict(zip(texts, enc(texts)))
    hits = [max(q.options, key=lambda k: float(vec[q.options[k]] @ vec[q.question])) == q.answer for q in qs]
    assert_near_chance(qs, {'embedding_similarity': float(np.mean(hits))})


# ---------- resume ----------
def test_resume_after_interruption(tmp_path):
    generate_benchmark(tmp_path, seed=6, **SMALL)
    mp4 = tmp_path / 'videos' / 'test-s6-000.mp4'
    good = mp4.read_bytes()
    mp4.write_bytes(good[: len(good) // 2])                      # a truncated file from a killed run
    man = generate_benchmark(tmp_path, seed=6, **SMALL)
    assert mp4.read_bytes() == good and man['videos'][0]['render_s'] > 0
    man = generate_benchmark(tmp_path, seed=6, **SMALL)          # complete: nothing re-rendered
    assert man['videos'][0]['render_s'] == 0
    done = mp4.with_name('test-s6-000.done.json')
    d = json.loads(done.read_text())
    done.write_text(json.dumps(dict(d, params=dict(d['params'], script='0' * 16))))   # made from another script
    assert generate_benchmark(tmp_path, seed=6, **SMALL)['videos'][0]['render_s'] > 0


# ---------- scale ----------
@pytest.mark.slow
def test_render_ten_minutes(tmp_path):
    man = generate_benchmark(tmp_path, minutes=10, videos=1, questions_per_video=12, seed=0, progress=False)
    mp4 = tmp_path / 'videos' / 'test-s0-000.mp4'
    assert [f.t for f in read_frames_at(mp4, [0.0, 599.0])] == [0.0, 599.0] and man['n_questions'] == 12
