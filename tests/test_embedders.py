"""Integration tests for reveal_kit.embedders and reveal_kit.index: real models (the packaged MiniLM), generated frames,
the model-selection plumbing (BGE-M3 / SigLIP discovery), and the index's exact and HNSW paths."""
import json
import os
import time

import cv2
import numpy as np
import pytest

from reveal_kit import embedders as E
from reveal_kit.index import VectorIndex, exact_topk


def scene(seed, palette=None, fine=False, size=(360, 640)):
    "A generated test frame from a random palette (same recipe as the notebook's `_scene`)."
    r = np.random.default_rng(seed); h, w = size
    pal = np.asarray(palette if palette is not None else r.integers(0, 256, (int(r.integers(3, 6)), 3)), np.float32)
    scale = int(r.integers(4, 24) if fine else r.integers(40, 160))
    f = cv2.resize(r.random((h // scale + 2, w // scale + 2, len(pal))).astype(np.float32), (w, h), interpolation=cv2.INTER_CUBIC)
    img = pal[f.argmax(-1)]
    if not fine:
        for _ in range(int(r.integers(2, 8))):
            c = tuple(float(x) for x in pal[r.integers(len(pal))]); x, y, rr = int(r.integers(0, w)), int(r.integers(0, h)), int(r.integers(10, 80))
            if r.random() < .5: cv2.circle(img, (x, y), rr, c, -1)
            else: cv2.rectangle(img, (x, y), (x + rr, y + rr // 2), c, -1)
    t = cv2.resize(r.random((h // 3 + 1, w // 3 + 1)).astype(np.float32), (w, h))[..., None]
    return np.clip(img * (0.8 + 0.4 * t), 0, 255).astype(np.uint8), pal


@pytest.fixture
def clean_env(monkeypatch):
    "Clear the per-process embedder caches around a test that changes the environment."
    for var in ('REVEAL_BGE_M3', 'REVEAL_SIGLIP', 'REVEAL_SIGLIP_ARCH'): monkeypatch.delenv(var, raising=False)
    E.get_text_embedder.cache_clear(); E.get_image_embedder.cache_clear()
    yield monkeypatch
    E.get_text_embedder.cache_clear(); E.get_image_embedder.cache_clear()


# ---------------------------------------------------------------- descriptor

def test_descriptor_segments_a_generated_video_at_theta():
    "Frames of a 3-shot 'video' (moving object, noise, a subtitle) group into exactly 3 runs at θ = 0.8."
    emb = E.DescriptorImageEmbedder()
    frames, shot_of = [], []
    rng = np.random.default_rng(7)
    for shot, seed in enumerate((11, 12, 13)):
        base = scene(seed)[0]
        for t in range(10):
            f = base.copy()
            cv2.circle(f, (60 + 50 * t, 180), 25, (250, 250, 40), -1)                  # an object crossing the frame
            if t % 3 == 0: cv2.putText(f, f'line {t}', (30, 340), cv2.FONT_HERSHEY_SIMPLEX, 1, (255, 255, 255), 2)
            f = np.clip(f + rng.normal(0, 6, f.shape), 0, 255).astype(np.uint8)
            frames.append(f); shot_of.append(shot)
    v = emb.encode(frames)
    adjacent = (v[1:] * v[:-1]).sum(1)
    cuts = [i + 1 for i, s in enumerate(adjacent) if s < 0.8]
    assert cuts == [10, 20], (cuts, np.round(adjacent, 3))
    assert adjacent[[i for i in range(29) if i + 1 not in (10, 20)]].min() > 0.9


def test_descriptor_is_fast_enough_for_600_frames():
    frames = [cv2.resize(scene(3)[0], (1280, 720))] * 600
    c0 = time.process_time(); E.DescriptorImageEmbedder().encode(frames); cpu = time.process_time() - c0
    assert cpu < 5, f"600 frames of 1280x720 took {cpu:.2f} s of CPU"     # CPU time: CI machines may be shared


def test_descriptor_rejects_bad_frames():
    emb = E.DescriptorImageEmbedder()
    with pytest.raises(ValueError, match='uint8'): emb.encode([np.zeros((10, 10, 3), np.float32)])
    with pytest.raises(ValueError, match='HxWx3'): emb.encode([np.zeros((10, 10, 5), np.uint8)])
    assert emb.encode(np.zeros((10, 10, 3), np.uint8)).shape == (1, emb.dim)    # a single frame is accepted


# ---------------------------------------------------------------- text

def test_text_embedder_retrieves_paraphrases_through_the_index(tmp_path, clean_env):
    te = E.get_text_embedder()
    narratives = {'n1': "A woman in a red coat feeds pigeons in a snowy park.",
                  'n2': "Two men repair a bicycle tyre in a garage.",
                  'n3': "A chef slices onions and tomatoes on a wooden board.",
                  'n4': "Children play football on a sunny beach."}
    ix = VectorIndex(te.dim, model_id=te.model_id)
    ix.add(list(narratives), te.encode(list(narratives.values())))
    queries = ["someone cooking vegetables in a kitchen", "kids kicking a ball by the sea", "fixing a bike wheel"]
    got = [r[0][0] for r in ix.search(te.encode(queries), k=2)]
    assert got == ['n3', 'n4', 'n2']
    ix.save(tmp_path / 'ix')
    assert json.loads((tmp_path / 'ix' / 'keys.json').read_text())['model_id'] == te.model_id
    back = VectorIndex.load(tmp_path / 'ix', model_id=te.model_id)
    assert back.search(te.encode(queries), k=1) == ix.search(te.encode(queries), k=1)
    with pytest.raises(ValueError, match='built with'): VectorIndex.load(tmp_path / 'ix', model_id='BAAI/bge-m3')


def test_bge_m3_request_without_weights_fails_loudly(clean_env, tmp_path):
    clean_env.setenv('REVEAL_BGE_M3', str(tmp_path / 'missing'))
    with pytest.raises(RuntimeError, match='REVEAL_BGE_M3'): E.get_text_embedder('bge-m3')
    auto = E.get_text_embedder('auto')
    assert auto.is_fallback and auto.model_id == E.MINILM_ID and 'packaged all-MiniLM-L6-v2' in auto.why


def test_bge_m3_plumbing_through_sentence_transformers(clean_env):
    "With REVEAL_BGE_M3 pointing at a sentence-transformers directory and no FlagEmbedding, the BGE-M3 route runs it."
    try:
        import FlagEmbedding  # noqa: F401
        pytest.skip("FlagEmbedding is installed: this test covers its absence")
    except ImportError: pass
    clean_env.setenv('REVEAL_BGE_M3', str(E.packaged_minilm_path()))          # stand-in weights: only the plumbing is tested
    te = E.get_text_embedder('bge-m3')
    assert te.model_id == E.BGE_M3_REPO and not te.is_fallback and te.backend == 'sentence-transformers'
    assert 'FlagEmbedding unavailable' in te.why
    assert te.encode(['hello']).shape == (1, te.dim)


def test_describe_embedders_is_json(clean_env):
    d = E.describe_embedders()
    json.dumps(d)
    for key in ('text', 'vision'):
        assert {'which', 'model_id', 'is_fallback', 'why'} <= set(d[key]) and d[key]['ok']


# ---------------------------------------------------------------- SigLIP discovery (no open_clip needed)

def test_find_siglip_local_dir_and_weights_file(clean_env, tmp_path):
    d = tmp_path / 'siglip'; d.mkdir()
    (d / 'open_clip_config.json').write_text('{"model_cfg": {}, "preprocess_cfg": {}}')
    clean_env.setenv('REVEAL_SIGLIP', str(d))
    assert E.find_siglip()[0] is None                                           # no weights file yet
    (d / 'open_clip_model.safetensors').write_bytes(b'')
    src, why = E.find_siglip()
    assert src['local_dir'] == str(d) and 'REVEAL_SIGLIP' in why
    clean_env.setenv('REVEAL_SIGLIP', str(d / 'open_clip_model.safetensors'))
    clean_env.setenv('REVEAL_SIGLIP_ARCH', 'ViT-B-16-SigLIP')
    src, _ = E.find_siglip()
    assert src == dict(model_name='ViT-B-16-SigLIP', pretrained=str(d / 'open_clip_model.safetensors'))


def test_auto_image_embedder_reports_why(clean_env):
    ie = E.get_image_embedder()
    if ie.backend == 'descriptor':
        assert ie.is_fallback and ie.model_id == E.DESCRIPTOR_ID and 'descriptor' in ie.why
        with pytest.raises(NotImplementedError): ie.encode_text(['a dog'])


@pytest.mark.gpu
def test_siglip_text_and_image_share_a_space():
    pytest.importorskip('open_clip')
    se = E.get_image_embedder('siglip')
    red, blue = np.zeros((384, 384, 3), np.uint8), np.zeros((384, 384, 3), np.uint8); red[..., 0] = 220; blue[..., 2] = 220
    s = se.encode([red, blue]) @ se.encode_text(['a plain red image', 'a plain blue image']).T
    assert s[0, 0] > s[0, 1] and s[1, 1] > s[1, 0]


# ---------------------------------------------------------------- index

def clustered(n, dim, seed=0, n_clusters=400):
    r = np.random.default_rng(seed)
    c = r.standard_normal((n_clusters, dim)).astype(np.float32)
    return c[r.integers(0, n_clusters, n)] + 0.7 * r.standard_normal((n, dim)).astype(np.float32)


def test_index_switches_to_hnsw_above_threshold_with_high_recall(tmp_path):
    XQ = clustered(8_200, 64); X, Q = XQ[:8_000], XQ[8_000:]                  # queries from the same clusters
    ix = VectorIndex(64, exact_threshold=5_000)                                 # the switch, at a size CI can afford
    ix.add([f'v{i}' for i in range(4_000)], X[:4_000])
    ix.search(Q[:1], 10)
    assert ix._hnsw is None                                                      # small: exact, no graph
    ix.add([f'v{i}' for i in range(4_000, 8_000)], X[4_000:])
    approx = ix.search(Q, 10)
    assert ix._hnsw is not None and len(ix._hnsw) == 8_000                       # above the threshold: HNSW over everything
    truth, _ = exact_topk(Q / np.linalg.norm(Q, axis=1, keepdims=True), ix.matrix, 10)
    recall = np.mean([len({k for k, _ in a} & {f'v{j}' for j in t}) / 10 for a, t in zip(approx, truth)])
    assert recall >= 0.95, recall
    assert all(a[i][1] >= a[i + 1][1] for a in approx for i in range(9))       # best first
    ix.save(tmp_path / 'big')
    back = VectorIndex.load(tmp_path / 'big')
    assert back.search(Q[:5], 10) == ix.search(Q[:5], 10)


def test_index_edge_cases():
    ix = VectorIndex(8)
    assert ix.search(np.ones(8), 3) == [[]]
    ix.add(['a'], np.ones((1, 8)))
    assert [k for k, _ in ix.search(np.ones(8), 5)[0]] == ['a']
    with pytest.raises(ValueError, match='dimension mismatch'): ix.search(np.ones(7), 1)
    with pytest.raises(ValueError, match='dimension mismatch'): ix.add(['b'], np.ones((1, 9)))
    with pytest.raises(ValueError, match='all-zero'): ix.add(['b'], np.zeros((1, 8)))
    with pytest.raises(ValueError, match='dim must be'): VectorIndex(0)


def test_index_bench_smoke(tmp_path):
    "benchmarks/index_bench.py runs end to end at a tiny size and reports sane numbers."
    import importlib.util, pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / 'benchmarks' / 'index_bench.py'
    spec = importlib.util.spec_from_file_location('index_bench', path); mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(['--sizes', '2000', '--kinds', 'clustered', '--queries', '20', '--dim', '32', '--json', str(tmp_path / 'b.json')])
    assert len(rows) == 1 and rows[0]['recall_at_10'] >= 0.9 and rows[0]['build_s'] > 0
    assert json.loads((tmp_path / 'b.json').read_text())[0]['n'] == 2000
