"""Integration tests for reveal_kit.retrieval.choice and reveal_kit.retrieval.index: real models (the packaged MiniLM), generated frames,
the model-selection plumbing (BGE-M3 / SigLIP discovery), and the index's exact and HNSW paths."""
import importlib.util
import json
import subprocess
import sys

import cv2
import numpy as np
import pytest

from reveal_kit.retrieval.choice import get_image_embedder, get_text_embedder
from reveal_kit.retrieval.frame_embedders import DESCRIPTOR_ID, DescriptorImageEmbedder, find_siglip
from reveal_kit.retrieval import onnx as onnx_mod
from reveal_kit.retrieval.onnx import OnnxMiniLM, ensure_minilm_onnx, minilm_onnx_path
from reveal_kit.retrieval.text_embedders import BGE_M3_REPO, MINILM_ID, SentenceTransformerText, packaged_minilm_path
from reveal_kit.retrieval.index import VectorIndex, exact_topk


def scene(seed, palette=None, fine=False, size=(360, 640)):
    "A generated test frame from a random palette (same recipe as the notebook's `_scene`)."
    r = np.random.default_rng(seed)
    h, w = size
    pal = np.asarray(palette if palette is not None else r.integers(0, 256, (int(r.integers(3, 6)), 3)), np.float32)
    scale = int(r.integers(4, 24) if fine else r.integers(40, 160))
    f = cv2.resize(r.random((h // scale + 2, w // scale + 2, len(pal))).astype(np.float32), (w, h),
                   interpolation=cv2.INTER_CUBIC)
    img = pal[f.argmax(-1)]
    if not fine:
        for _ in range(int(r.integers(2, 8))):
            c = tuple(float(x) for x in pal[r.integers(len(pal))])
            x, y, rr = int(r.integers(0, w)), int(r.integers(0, h)), int(r.integers(10, 80))
            if r.random() < .5: cv2.circle(img, (x, y), rr, c, -1)
            else: cv2.rectangle(img, (x, y), (x + rr, y + rr // 2), c, -1)
    t = cv2.resize(r.random((h // 3 + 1, w // 3 + 1)).astype(np.float32), (w, h))[..., None]
    return np.clip(img * (0.8 + 0.4 * t), 0, 255).astype(np.uint8), pal


@pytest.fixture
def clean_env(monkeypatch):
    "Clear the per-process embedder caches around a test that changes the environment."
    for var in ('REVEAL_BGE_M3', 'REVEAL_SIGLIP', 'REVEAL_SIGLIP_ARCH', 'REVEAL_ONNX'):
        monkeypatch.delenv(var, raising=False)
    get_text_embedder.cache_clear()
    get_image_embedder.cache_clear()
    yield monkeypatch
    get_text_embedder.cache_clear()
    get_image_embedder.cache_clear()


# ---------------------------------------------------------------- descriptor

def test_descriptor_segments_a_generated_video_at_theta():
    "Frames of a 3-shot 'video' (moving object, noise, a subtitle) group into exactly 3 runs at θ = 0.8."
    emb = DescriptorImageEmbedder()
    frames, shot_of = [], []
    rng = np.random.default_rng(7)
    for shot, seed in enumerate((11, 12, 13)):
        base = scene(seed)[0]
        for t in range(10):
            f = base.copy()
            cv2.circle(f, (60 + 50 * t, 180), 25, (250, 250, 40), -1)                  # an object crossing the frame
            if t % 3 == 0: cv2.putText(f, f'line {t}', (30, 340), cv2.FONT_HERSHEY_SIMPLEX, 1, (255, 255, 255), 2)
            f = np.clip(f + rng.normal(0, 6, f.shape), 0, 255).astype(np.uint8)
            frames.append(f)
            shot_of.append(shot)
    v = emb.encode(frames)
    adjacent = (v[1:] * v[:-1]).sum(1)
    cuts = [i + 1 for i, s in enumerate(adjacent) if s < 0.8]
    assert cuts == [10, 20], (cuts, np.round(adjacent, 3))
    assert adjacent[[i for i in range(29) if i + 1 not in (10, 20)]].min() > 0.9


# ---------------------------------------------------------------- text

def test_text_embedder_retrieves_paraphrases_through_the_index(tmp_path, clean_env):
    te = get_text_embedder()
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
    with pytest.raises(RuntimeError, match='REVEAL_BGE_M3'): get_text_embedder('bge-m3')
    auto = get_text_embedder('auto')
    assert auto.is_fallback and auto.model_id == MINILM_ID and 'packaged all-MiniLM-L6-v2' in auto.why


def test_bge_m3_plumbing_through_sentence_transformers(clean_env):
    "With REVEAL_BGE_M3 pointing at a sentence-transformers directory and no FlagEmbedding, the BGE-M3 route runs it."
    clean_env.setitem(sys.modules, 'FlagEmbedding', None)                     # FlagEmbedding absent (or broken)
    clean_env.setenv('REVEAL_BGE_M3', str(packaged_minilm_path()))          # stand-in weights: only the plumbing
    te = get_text_embedder('bge-m3')
    assert te.model_id == BGE_M3_REPO and not te.is_fallback
    assert te.encode(['hello']).shape == (1, te.dim)                          # the route is chosen at load time
    assert te.backend == 'sentence-transformers' and 'FlagEmbedding unavailable' in te.why


# ---------------------------------------------------------------- the packaged MiniLM through ONNX

PARITY_TEXTS = ["", " ", "a", "Hello world!", "HELLO WORLD", "12345 3.14159", "2024-12-01T07:52:59Z",
                "naïve café résumé", "東京は日本の首都です。", "안녕하세요 세계", "Привет, мир!", "مرحبا بالعالم",
                "emoji 😀🎉🚀", "zero\u200bwidth", "tab\tand\nnewline", "<div class='slide'>code</div>",
                "SELECT * FROM users WHERE id = 1;", "x" * 300, "ab" * 200,
                "A man opens the red door of the kitchen.", "Someone opens a red kitchen door.",
                " ".join(["the quick brown fox jumps over the lazy dog"] * 15),        # > 128 word pieces
                " ".join(["slide deck presentation notebook"] * 80)]                 # > 256: truncated


def test_onnx_minilm_equals_sentence_transformers():
    "Same vectors as sentence-transformers (cosine >= 0.999 on every text), same model id, its own backend."
    st = SentenceTransformerText(packaged_minilm_path(), MINILM_ID, is_fallback=True)
    om = OnnxMiniLM()
    a, b = om.encode(PARITY_TEXTS), st.encode(PARITY_TEXTS)
    assert om.backend == 'onnxruntime' and st.backend == 'sentence-transformers'
    assert a.shape == b.shape == (len(PARITY_TEXTS), 384) and a.dtype == np.float32
    cos = (a * b).sum(1)
    assert cos.min() >= 0.999, (cos.min(), PARITY_TEXTS[int(cos.argmin())])
    assert np.allclose(np.linalg.norm(a, axis=1), 1, atol=1e-5)
    assert om.model_id == st.model_id and om.dim == st.dim


def test_memories_built_with_either_backend_are_interchangeable():
    "A memory embedded through sentence-transformers is searched through ONNX (and back) with the same results."
    from reveal_kit.core import MemoryItem
    from reveal_kit.memory.store import OfflineMemory, memory_models
    st = SentenceTransformerText(packaged_minilm_path(), MINILM_ID, is_fallback=True)
    om = OnnxMiniLM()
    assert memory_models(None, st, DescriptorImageEmbedder()) == memory_models(None, om, DescriptorImageEmbedder())
    texts = ["a chef slices onions on a wooden board", "two men repair a bicycle tyre in a garage",
             "children play football on a sunny beach", "a woman feeds pigeons in a snowy park"]
    items = [MemoryItem(f'L1_{i}', 1, 10. * i, 10. * i + 10, t) for i, t in enumerate(texts)]
    built = OfflineMemory.from_items(items, text_embedder=st)
    queried = OfflineMemory(built.items, built._tv, manifest=built.manifest, text_embedder=om)
    assert queried.text_embedder is om                                          # same model id: accepted
    q = om.encode(["kids kicking a ball by the sea", "fixing a bike wheel", "cutting vegetables"])
    assert [int(i) for i in (q @ built._tv.T).argmax(1)] == [2, 1, 0]
    assert np.allclose(built._tv, om.encode(texts), atol=1e-4)


def test_onnx_file_is_cached_by_the_weights_hash(tmp_path, monkeypatch):
    "The export goes to $REVEAL_CACHE_DIR/onnx/minilm-<sha12>.onnx and runs once; later loads reuse the file."
    import hashlib
    monkeypatch.setenv('REVEAL_CACHE_DIR', str(tmp_path))
    w = packaged_minilm_path() / 'model.safetensors'
    sha = hashlib.sha256(w.read_bytes()).hexdigest()
    assert minilm_onnx_path() == tmp_path / 'onnx' / f'minilm-{sha[:12]}.onnx'
    calls = []
    def export(d, out):                                     # as the real export: the file, then its SHA-256 record
        calls.append(out)
        out.write_bytes(b'x')
        onnx_mod.record_export(out)
    monkeypatch.setattr(onnx_mod, '_export_in_child', export)
    assert ensure_minilm_onnx() == ensure_minilm_onnx() == minilm_onnx_path()
    assert len(calls) == 1


def test_failed_export_falls_back_to_sentence_transformers(tmp_path, monkeypatch):
    monkeypatch.setenv('REVEAL_CACHE_DIR', str(tmp_path))
    def broken(d, out): raise RuntimeError('ONNX export of x failed: no onnx')
    monkeypatch.setattr(onnx_mod, '_export_in_child', broken)
    om = OnnxMiniLM(why='packaged')
    v = om.encode(['hello world'])
    assert om.backend == 'sentence-transformers' and 'no onnx' in om.why and om.model_id == MINILM_ID
    assert v.shape == (1, 384)


def test_choosing_an_embedder_imports_no_model_library():
    "get_text_embedder / get_image_embedder / memory_models import neither torch nor onnxruntime; encode loads once."
    code = ("import sys; from reveal_kit.retrieval.choice import get_text_embedder; "
            "from reveal_kit.memory.store import memory_models; "
            "m = memory_models(); heavy = [x for x in ('torch', 'onnxruntime', 'sentence_transformers', 'open_clip', "
            "'transformers') if x in sys.modules]; te = get_text_embedder('minilm'); te.encode(['a']); "
            "s = te._session; te.encode(['b']); "
            "print(heavy, m['text_embedder'], s is te._session, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ['[]', MINILM_ID, 'True', 'False'], r.stdout


# ---------------------------------------------------------------- SigLIP discovery (no open_clip needed)

def test_find_siglip_local_dir_and_weights_file(clean_env, tmp_path):
    d = tmp_path / 'siglip'
    d.mkdir()
    (d / 'open_clip_config.json').write_text('{"model_cfg": {}, "preprocess_cfg": {}}')
    clean_env.setenv('REVEAL_SIGLIP', str(d))
    assert find_siglip()[0] is None                                           # no weights file yet
    (d / 'open_clip_model.safetensors').write_bytes(b'')
    src, why = find_siglip()
    assert src['local_dir'] == str(d) and 'REVEAL_SIGLIP' in why
    clean_env.setenv('REVEAL_SIGLIP', str(d / 'open_clip_model.safetensors'))
    clean_env.setenv('REVEAL_SIGLIP_ARCH', 'ViT-B-16-SigLIP')
    src, _ = find_siglip()
    assert src == dict(model_name='ViT-B-16-SigLIP', pretrained=str(d / 'open_clip_model.safetensors'))


def test_auto_image_embedder_without_open_clip_reports_why(clean_env):
    "Without open_clip, 'auto' is the descriptor with the reason, text-to-frame search says what is missing."
    clean_env.setitem(sys.modules, 'open_clip', None)
    ie = get_image_embedder()
    assert ie.is_fallback and ie.model_id == DESCRIPTOR_ID and 'open_clip is not installed' in ie.why
    with pytest.raises(NotImplementedError, match='no text tower'): ie.encode_text(['a dog'])
    with pytest.raises(RuntimeError, match='open_clip'): get_image_embedder('siglip')


def _siglip_available() -> bool:
    return importlib.util.find_spec('open_clip') is not None and find_siglip()[0] is not None


@pytest.mark.skipif(not _siglip_available(), reason="needs open_clip and local SigLIP weights")
def test_siglip_text_and_image_share_a_space():
    se = get_image_embedder('siglip')
    red, blue = np.zeros((384, 384, 3), np.uint8), np.zeros((384, 384, 3), np.uint8)
    red[..., 0] = 220
    blue[..., 2] = 220
    s = se.encode([red, blue]) @ se.encode_text(['a plain red image', 'a plain blue image']).T
    assert s[0, 0] > s[0, 1] and s[1, 1] > s[1, 0]


# ---------------------------------------------------------------- index

def clustered(n, dim, seed=0, n_clusters=400):
    r = np.random.default_rng(seed)
    c = r.standard_normal((n_clusters, dim)).astype(np.float32)
    return c[r.integers(0, n_clusters, n)] + 0.7 * r.standard_normal((n, dim)).astype(np.float32)


def test_index_switches_to_hnsw_above_threshold_with_high_recall(tmp_path):
    XQ = clustered(8_200, 64)
    X, Q = XQ[:8_000], XQ[8_000:]                                               # queries from the same clusters
    ix = VectorIndex(64, exact_threshold=5_000)                                 # the switch, at a size CI can afford
    ix.add([f'v{i}' for i in range(4_000)], X[:4_000])
    ix.search(Q[:1], 10)
    assert ix._hnsw is None                                                      # small: exact, no graph
    ix.add([f'v{i}' for i in range(4_000, 8_000)], X[4_000:])
    approx = ix.search(Q, 10)
    assert ix._hnsw is not None and len(ix._hnsw) == 8_000                       # above the threshold: HNSW over all
    truth, _ = exact_topk(Q / np.linalg.norm(Q, axis=1, keepdims=True), ix.matrix, 10)
    recall = np.mean([len({k for k, _ in a} & {f'v{j}' for j in t}) / 10 for a, t in zip(approx, truth)])
    assert recall >= 0.95, recall
    assert all(a[i][1] >= a[i + 1][1] for a in approx for i in range(9))       # best first
    ix.save(tmp_path / 'big')
    back = VectorIndex.load(tmp_path / 'big')
    assert back.search(Q[:5], 10) == ix.search(Q[:5], 10)


def test_index_bench_smoke(tmp_path):
    "benchmarks/index_bench.py runs end to end at a tiny size and reports sane numbers."
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / 'benchmarks' / 'index_bench.py'
    spec = importlib.util.spec_from_file_location('index_bench', path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(['--sizes', '2000', '--kinds', 'clustered', '--queries', '20', '--dim', '32',
                     '--json', str(tmp_path / 'b.json')])
    assert len(rows) == 1 and rows[0]['recall_at_10'] >= 0.9
    assert {'build_s', 'build_cpu_s', 'median_query_ms', 'exact_numpy_ms_per_query'} <= set(rows[0])
    assert json.loads((tmp_path / 'b.json').read_text())[0]['n'] == 2000


def test_reusing_a_finished_memory_loads_no_model(tmp_path):
    "A reused `build_memory` and `OfflineMemory.load` import no embedder runtime and no OCR (fresh interpreter)."
    from reveal_kit.testing.videos import make_test_video
    from reveal_kit.memory.build import build_memory
    vid = make_test_video(tmp_path / 'v.mp4', [(3, 1), (3, 2)], fps=4)
    build_memory(vid, tmp_path / 'mem', progress=False)
    code = ("import sys; from reveal_kit.memory.build import build_memory; "
            "from reveal_kit.memory.store import OfflineMemory; "
            f"s = build_memory({str(vid)!r}, {str(tmp_path / 'mem')!r}, progress=False); "
            f"m = OfflineMemory.load({str(tmp_path / 'mem')!r}); "
            "print(s['reused'], [x for x in ('torch', 'onnxruntime', 'sentence_transformers', 'rapidocr_onnxruntime', "
            "'open_clip', 'cv2') if x in sys.modules])")
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ['True', '[]'], r.stdout
