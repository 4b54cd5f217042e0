"""Throughput of the real vLLM engine, and what the kit costs on top of it.

Against a real `vllm serve` (started here on 127.0.0.1 from `--model`, by default the packaged Gemma-3-270M converted
for vLLM, and stopped at the end; or an existing one with `--base-url`), it measures

* tokens/s of a bare client (`httpx`, one thread per request in flight) at each concurrency (`--concurrency`,
  1/8/16), every request asking for exactly `--max-tokens` tokens (`ignore_eos`), next to the kit's
  `OpenAIHTTPModel.chat_many` issuing the same requests with as many workers: the kit's overhead as the ratio of its
  throughput to the bare client's (goal >= 0.9);
* memory-build captions/s: the offline memory of a generated video built through the server (`--captions-concurrency`);
* REVEAL questions/s: `run_eval(method='reveal', backend='http')` over that video's generated questions;
* the in-process engine (`VLLMModel`'s `vllm.LLM`: `c` conversations per batch) on the same requests, once the server
  is stopped (skipped with `--no-inprocess`; `--inprocess-only` runs only this).

It prints one markdown table and writes the numbers as JSON (`--out`), with the kit's tokens/s by concurrency as the
throughput profile `reveal eval cost --profile` reads (`model`, `gpu`, `points`). The base model's replies are not
meaningful: the numbers are throughput, not accuracy. A text-only model gets `REVEAL_IMAGES=no` and captions and
summaries capped at `--text-max-tokens` (as `make test-vllm` does), unless `--images` says the model takes frames.

    PYTHONPATH=. .venv-vllm/bin/python benchmarks/vllm_bench.py [--model DIR] [--base-url URL --name NAME]
        [--concurrency 1,8,16] [--max-tokens 128] [--minutes 1] [--questions 4] [--no-inprocess] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COMPACT_JSON = {'backend': 'xgrammar', 'disable_any_whitespace': True}


def prompts(n: int) -> list[list[dict]]:
    "`n` distinct one-turn conversations (no prefix shared beyond the template, so no request is a cache hit)."
    return [[{'role': 'user', 'content': f'Request {i}: describe a busy street at {i % 24}:{i % 60:02d} in detail.'}]
            for i in range(n)]


def bare_client(url: str, name: str, convs: list, max_tokens: int, conc: int) -> dict:
    "Tokens/s of plain `httpx` posts, `conc` in flight."
    client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=None))
    body = lambda c: {'model': name, 'messages': c, 'max_tokens': max_tokens, 'temperature': 0.0, 'ignore_eos': True}
    post = lambda c: client.post(f'{url}/chat/completions', json=body(c)).json()['usage']
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as ex: us = list(ex.map(post, convs))
    dt = time.perf_counter() - t0
    return _rates(sum(u['prompt_tokens'] for u in us), sum(u['completion_tokens'] for u in us), dt)


def _rates(prompt: int, completion: int, seconds: float) -> dict:
    "Tokens and tokens/s of a timed set of requests."
    return {'tokens': completion, 'prompt_tokens': prompt, 'seconds': round(seconds, 2),
            'tokens_per_s': round(completion / seconds, 1), 'prompt_tokens_per_s': round(prompt / seconds, 1)}


def kit_client(model, convs: list, max_tokens: int, conc: int) -> dict:
    "Tokens/s of the kit's `chat_many` on the same requests, `conc` workers."
    t0 = time.perf_counter()
    res = model.chat_many(convs, role='bench', max_tokens=max_tokens, max_workers=conc)
    dt = time.perf_counter() - t0
    assert all(r.ok for r in res), [r.record.error for r in res if not r.ok][:3]
    return _rates(sum(r.record.prompt_tokens for r in res), sum(r.record.completion_tokens for r in res), dt)


def client_rows(url: str, name: str, levels: list[int], max_tokens: int) -> list[dict]:
    "Bare client and kit side by side at each concurrency (a warm-up request first)."
    from reveal_kit.backends.http import OpenAIHTTPModel
    kit = OpenAIHTTPModel(url, model=name, timeout=600, extra_body={'ignore_eos': True}, supports_images=False)
    kit.progress_after_s = None                                 # no 'waiting for' lines: every reply here is long
    bare_client(url, name, prompts(1), 8, 1)
    rows = []
    for c in levels:
        convs = prompts(max(2 * c, 4))
        b, k = bare_client(url, name, convs, max_tokens, c), kit_client(kit, convs, max_tokens, c)
        rows.append({'concurrency': c, 'requests': len(convs), 'bare': b, 'kit': k,
                     'ratio': round(k['tokens_per_s'] / b['tokens_per_s'], 3)})
        print(f"  concurrency {c}: bare {b['tokens_per_s']} tok/s, kit {k['tokens_per_s']} tok/s", flush=True)
    return rows


def pipeline_rows(url: str, name: str, work: Path, minutes: float, questions: int, conc: int) -> dict:
    "Captions/s of a memory build and questions/s of REVEAL, both through the server."
    from reveal_kit.backends.models import get_chat_model
    from reveal_kit.eval.runner import run_eval
    from reveal_kit.memory.build import build_memory
    from reveal_kit.synth.bench import generate_benchmark
    os.environ['REVEAL_RUNS'] = str(work / 'runs')          # the run below finds the memory built here
    generate_benchmark(work / 'bench', minutes=minutes, videos=1, questions_per_video=questions, seed=0,
                       split='test', size=(640, 360))
    video = next((work / 'bench' / 'videos').glob('*.mp4'))
    srt = video.with_suffix('.srt')
    m = get_chat_model('http', name, url, cache_mode='off')
    b = build_memory(video, chat_model=m, subtitles=srt if srt.exists() else None, progress=False, concurrency=conc)
    t0 = time.perf_counter()
    s = run_eval('synth', 'reveal', work / 'run', root=work / 'bench', backend='http', model=name, base_url=url,
                 concurrency=conc, cache_mode='off', progress=False)
    dt = time.perf_counter() - t0
    n_q = sum(1 for _ in (work / 'run' / 'results.jsonl').open())
    return {'captions': b['n_l1'], 'build_seconds': b['seconds'], 'captions_per_s': round(b['n_l1'] / b['seconds'], 3),
            'questions': n_q, 'eval_seconds': round(dt, 1), 'questions_per_s': round(n_q / dt, 4),
            'memory_reused_by_run': s.get('memories_built', None), 'summary': s}


def inprocess_rows(model_dir: str, levels: list[int], max_tokens: int) -> list[dict]:
    "Tokens/s of the in-process engine on the same requests: one `chat_many` batch per level."
    os.environ.setdefault('VLLM_ENABLE_V1_MULTIPROCESSING', '0')
    from reveal_kit.backends.vllm import VLLMModel
    t0 = time.perf_counter()
    import vllm
    vm = VLLMModel(model_dir, max_model_len=8192, enforce_eager=True, supports_images=False,
                   structured_outputs_config=COMPACT_JSON)
    vm.engine()
    start = time.perf_counter() - t0
    rows = []
    for c in levels:
        convs = prompts(max(2 * c, 4))
        sp = vllm.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        t1 = time.perf_counter()
        outs = []
        for i in range(0, len(convs), c):                        # `c` conversations per batch, as `c` in flight
            outs += vm.engine().chat(convs[i:i + c], sp, use_tqdm=False)
        dt = time.perf_counter() - t1
        toks = sum(len(o.outputs[0].token_ids) for o in outs)
        rows.append({'concurrency': c, 'requests': len(convs), 'tokens': toks, 'seconds': round(dt, 2),
                     'tokens_per_s': round(toks / dt, 1)})
    return [{'engine_start_s': round(start, 1)}, *rows]


def table(res: dict) -> str:
    "The markdown table of a run."
    inproc = {r['concurrency']: r for r in res.get('inprocess', [])[1:]}
    lines = ['| concurrency | bare client tok/s | kit tok/s | kit / bare | in-process tok/s |', '|---|---|---|---|---|']
    for r in res['clients']:
        ip = inproc.get(r['concurrency'], {}).get('tokens_per_s', '—')
        lines.append(f"| {r['concurrency']} | {r['bare']['tokens_per_s']} | {r['kit']['tokens_per_s']} | "
                     f"{r['ratio']:.2f} | {ip} |")
    p = res.get('pipeline')
    if p:
        lines += ['', '| memory build | captions/s | REVEAL | questions/s |', '|---|---|---|---|',
                  f"| {p['captions']} captions in {p['build_seconds']:.0f} s | {p['captions_per_s']:.3f} | "
                  f"{p['questions']} questions in {p['eval_seconds']:.0f} s | {p['questions_per_s']:.4f} |"]
    if res.get('inprocess'): lines.append(f"\nin-process engine start: {res['inprocess'][0]['engine_start_s']} s")
    lines.append(f"server ready after {res.get('server_ready_s', '—')} s; {res['device']}")
    return '\n'.join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--model', help="HF model folder to serve (default: the packaged Gemma-3-270M, converted)")
    ap.add_argument('--base-url', help="an existing server instead of starting one")
    ap.add_argument('--name', default='gemma', help="served model name")
    ap.add_argument('--concurrency', default='1,8,16')
    ap.add_argument('--max-tokens', type=int, default=128)
    ap.add_argument('--minutes', type=float, default=1.0, help="length of the generated video")
    ap.add_argument('--questions', type=int, default=4, help="generated questions for the REVEAL row")
    ap.add_argument('--captions-concurrency', type=int, default=8)
    ap.add_argument('--text-max-tokens', type=int, default=48)
    ap.add_argument('--images', action='store_true', help="the model takes frames (a VLM)")
    ap.add_argument('--no-inprocess', action='store_true')
    ap.add_argument('--no-pipeline', action='store_true', help="only the client rows")
    ap.add_argument('--inprocess-only', action='store_true', help="only the in-process engine (no server)")
    ap.add_argument('--gpu', action='store_true', help="serve with the GPU defaults (no --enforce-eager)")
    ap.add_argument('--out', default='runs/bench/vllm.json')
    return ap.parse_args(argv)


def device() -> str:
    "What the engine runs on."
    try:
        import torch
        if torch.cuda.is_available(): return f"GPU: {torch.cuda.get_device_name(0)}"
    except Exception: pass
    return f"CPU: {os.cpu_count()} cores"


def run(a, url: str, model_dir: str | None, res: dict) -> None:
    "The client rows and (unless switched off) the pipeline rows against `url`."
    levels = [int(x) for x in a.concurrency.split(',') if x.strip()]
    res['clients'] = client_rows(url, a.name, levels, a.max_tokens)
    if not a.no_pipeline:
        with tempfile.TemporaryDirectory() as d:
            res['pipeline'] = pipeline_rows(url, a.name, Path(d), a.minutes, a.questions, a.captions_concurrency)


def main(argv=None) -> dict:
    a = parse_args(argv)
    if not a.images: os.environ.setdefault('REVEAL_IMAGES', 'no')
    os.environ.setdefault('REVEAL_TEXT_MAX_TOKENS', str(a.text_max_tokens))
    # `model`, `gpu` and `points` are the throughput profile `reveal eval cost --profile` reads
    res = {'device': device(), 'gpu': device(), 'max_tokens': a.max_tokens, 'model': a.model or 'packaged Gemma-3-270M'}
    model_dir = a.model
    if a.inprocess_only:
        from reveal_kit.backends.vllm import packaged_vllm_model
        model_dir = model_dir or str(packaged_vllm_model())
        res['clients'] = []
    elif a.base_url: run(a, a.base_url.rstrip('/'), model_dir, res)
    else:
        from reveal_kit.backends.vllm import VLLMServer, packaged_vllm_model
        model_dir = model_dir or str(packaged_vllm_model())
        with VLLMServer(model_dir, name=a.name, ready_s=900, eager=not a.gpu, compact_json=True) as srv:
            res['server_ready_s'] = round(srv.ready_after_s, 1)
            run(a, srv.url, model_dir, res)
    if model_dir and (a.inprocess_only or not a.no_inprocess):
        res['inprocess'] = inprocess_rows(model_dir, [int(x) for x in a.concurrency.split(',')], a.max_tokens)
    res['points'] = [{'concurrency': r['concurrency'], 'prompt_tokens_per_s': r['kit']['prompt_tokens_per_s'],
                      'completion_tokens_per_s': r['kit']['tokens_per_s']} for r in res['clients']]
    print(table(res))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    print(f"wrote {a.out}")
    return res


if __name__ == '__main__':
    main()
