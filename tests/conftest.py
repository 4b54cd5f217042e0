"""Shared pytest setup: offline model hubs, GPU tests skipped where no CUDA device exists, a small benchmark."""
import os
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope='module')
def minute_bench(tmp_path_factory, request):
    "A one-minute generated benchmark (one video, one question); REVEAL_RUNS beneath it for the module."
    from reveal_kit.synth.bench import generate_benchmark
    d = tmp_path_factory.mktemp(request.module.__name__.rsplit('.', 1)[-1])
    old = os.environ.get('REVEAL_RUNS')
    os.environ['REVEAL_RUNS'] = str(d / 'runs')
    generate_benchmark(d / 'bench', minutes=1, videos=1, questions_per_video=1, seed=0, progress=False)
    yield d
    if old is None: os.environ.pop('REVEAL_RUNS', None)
    else: os.environ['REVEAL_RUNS'] = old
