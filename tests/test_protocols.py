"""The kit's real chat backends and memories offer what `reveal_kit.protocols` says a role and an agent read."""
import pytest

from reveal_kit.protocols import ChatModel, Memory
from reveal_kit.backends.chat import ScriptedModel
from reveal_kit.backends.cache import CachedModel
from reveal_kit.backends.http import OpenAIHTTPModel
from reveal_kit.backends.llamacpp import LlamaCppModel
from reveal_kit.backends.vllm import VLLMModel
from reveal_kit.eval.replay import PackedModel
from reveal_kit.memory.store import OfflineMemory
from reveal_kit.testing.fakes import HashEmbedder, TinyMemory, synthetic_items
from reveal_kit.testing.scripted import StampedFrames


@pytest.mark.parametrize('cls', [LlamaCppModel, VLLMModel])
def test_in_process_backends_are_chat_models(cls):
    "Each in-process backend class offers every member (checked on a bare instance: no weights loaded)."
    assert isinstance(object.__new__(cls), ChatModel)


def test_http_backend_is_a_chat_model():
    "The OpenAI-compatible client (made, not called: no server needed)."
    assert isinstance(OpenAIHTTPModel('http://127.0.0.1:9/v1', model='m'), ChatModel)


def test_wrapped_and_test_models_are_chat_models(tmp_path):
    "The cache in front of a model, a pack's stand-in and the scripted test model."
    card = dict(backend='http', model_id='m', meaningful=True)
    for m in (ScriptedModel(), CachedModel(ScriptedModel(), tmp_path / 'cache'), PackedModel(card)):
        assert isinstance(m, ChatModel), m


def test_memories_are_memories():
    "The offline memory, the test fixture and a fixture with stamped frames; a model is not a memory."
    items = synthetic_items(6)
    for mem in (OfflineMemory.from_items(items, HashEmbedder()), TinyMemory(items), StampedFrames(TinyMemory(items))):
        assert isinstance(mem, Memory), mem
    assert not isinstance(ScriptedModel(), Memory)
    assert not isinstance(TinyMemory(items), ChatModel)
