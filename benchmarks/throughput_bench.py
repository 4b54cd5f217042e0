"""Throughput against a simulated fleet: `reveal` questions/s through the runner and memory-build captions/s.

Starts OpenAI-compatible stub servers on 127.0.0.1 (a process per replica, stopped at the end). Each answers after a
fixed latency (`--latency`, 0.5 s) with valid JSON for the role asked (an instance of the request's `response_format`
schema; plain text for captions and summaries), serves at most `--replica-slots` requests at once (like a vLLM
server's batch; the rest wait), and records when each request was served. For every replica count (1 and 3) and
concurrency (1, 4, 16, 64) it runs

* `reveal` through `reveal_kit.eval.runner.run_eval(backend='http', base_url=<the replicas>, concurrency=N,
  cache_mode='off')` over generated questions whose memories were built beforehand, and
* the caption and summary stages of a memory build with `concurrency=N` (the frame pass is read back from a
  finished build, as a resumed build does),

and prints a markdown table: questions/s, captions/s, the mean and max requests being served, and the ratio to the
ideal latency-bound throughput `min(N, replicas * slots) / latency` requests/s (for questions: divided by the requests
a question needs). Bounded work (`--questions`, `--captions`); it stops by itself. The runner and the agent loop run
in this process, so where few cores are free, questions/s is bounded by the client's CPU per question (printed) rather
than by the servers.

    .venv/bin/python benchmarks/throughput_bench.py [--latency 0.5] [--replica-slots 8] [--questions 96]
        [--captions 128] [--concurrency 1,4,16,64] [--replicas 1,3] [--out DIR] [--keep]
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')

MODEL = 'stub-vlm'


def _words(payload: dict) -> list[str]:
    "The words of the request's last message (what a deterministic reply is made of)."
    c = payload['messages'][-1].get('content') or ''
    text = c if isinstance(c, str) else ' '.join(p.get('text', '') for p in c if p.get('type') == 'text')
    return text.replace('"', ' ').split() or ['nothing']


def sample(schema: dict, words: list[str], h: int) -> object:
    "A valid instance of a simple JSON schema: enums by `h` (numbers: the largest), strings from `words`."
    s = schema or {}
    if 'const' in s: return s['const']
    if 'enum' in s:
        e = s['enum']
        return max(e) if all(isinstance(x, (int, float)) for x in e) else e[h % len(e)]
    for k in ('anyOf', 'oneOf', 'allOf'):
        if k in s: return sample(s[k][0], words, h)
    t = s.get('type', 'object')
    t = t[0] if isinstance(t, list) else t
    if t == 'object': return {k: sample(v, words, h + i) for i, (k, v) in enumerate(s.get('properties', {}).items())}
    if t == 'array':
        it = s.get('items', {})
        n = min(max(s.get('minItems', 0), 0 if 'enum' in it else 2), s.get('maxItems', 8))
        if 'enum' in it: return [it['enum'][(h + i) % len(it['enum'])] for i in range(min(n, len(it['enum'])))]
        return [sample(it, words, h + 7 * i + 1) for i in range(n)]
    if t == 'string':
        i = h % len(words)
        text = ' '.join((words[i:] + words[:i])[:8])
        return text[:s.get('maxLength', 200)] or 'x'
    if t in ('integer', 'number'): return s.get('minimum', 1)
    return True if t == 'boolean' else None


def stub_reply(payload: dict) -> str:
    "The stub model's reply: schema-valid JSON when a `response_format` is asked, else a caption/summary sentence."
    words = _words(payload)
    h = int(hashlib.sha256(' '.join(words).encode()).hexdigest()[:8], 16)
    rf = payload.get('response_format') or {}
    schema = rf.get('json_schema', {}).get('schema') or rf.get('schema')
    if schema: return json.dumps(sample(schema, words, h))
    return f"A person near the {words[h % len(words)]} looks at the {words[(h // 7) % len(words)]}."


def kind(payload: dict) -> str:
    "Which role asked: 'caption', 'summary' or 'loop' (planner, verifier, answerer)."
    text = ' '.join(_words(payload)[:12])
    return 'caption' if 'searchable memory' in text else 'summary' if text.startswith('Summarize') else 'loop'


class StubReplica:
    "One simulated model server: fixed latency, at most `slots` requests served at once, a log of what it served."
    # run in a process of its own (`--serve`), as a real server is: the client's threads do not share its interpreter
    def __init__(self, latency: float, slots: int | None):
        self.latency, self.lock, self.log = latency, threading.Lock(), []
        self.slots = threading.BoundedSemaphore(slots) if slots else contextlib.nullcontext()

    def serve(self, payload: dict) -> dict:
        "Wait for a slot, hold it `latency` seconds, answer."
        with self.slots:
            t0 = time.monotonic()
            time.sleep(self.latency)
            text = stub_reply(payload)
            with self.lock: self.log.append((kind(payload), t0, time.monotonic()))
        msg = {'role': 'assistant', 'content': text}
        return {'choices': [{'index': 0, 'message': msg, 'finish_reason': 'stop'}],
                'usage': {'prompt_tokens': len(_words(payload)), 'completion_tokens': len(text.split())}}

    def start(self) -> 'StubReplica':
        rep = self

        class H(BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'
            def log_message(self, *a): pass

            def _send(self, body: dict):
                b = json.dumps(body).encode()
                self.send_response(200)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def do_GET(self):
                if self.path.endswith('/stats'):
                    with rep.lock: return self._send({'log': list(rep.log)})
                self._send({'object': 'list', 'data': [{'id': MODEL, 'object': 'model'}]})

            def do_POST(self):
                self._send(rep.serve(json.loads(self.rfile.read(int(self.headers.get('Content-Length', 0))))))

        class S(ThreadingHTTPServer):
            request_queue_size, daemon_threads = 512, True

        self.httpd = S(('127.0.0.1', 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self


def serve(latency: float, slots: int) -> None:
    "The `--serve` mode: one stub replica; prints its URL, serves until stdin closes."
    r = StubReplica(latency, slots or None).start()
    print(r.url, flush=True)
    sys.stdin.read()


class Replica:
    "A stub replica in its own process: `url`, `log()` of what it served, `stop()`."
    def __init__(self, latency: float, slots: int):
        self.proc = subprocess.Popen([sys.executable, __file__, '--serve', str(latency), str(slots)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith('http'): raise RuntimeError('the stub server did not start')

    def log(self) -> list:
        import httpx
        return httpx.get(f"{self.url}/stats", timeout=30).json()['log']

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def served(logs: list, a: float, b: float, what: str | None = None) -> tuple[float, int]:
    "Request-seconds served inside [a, b] (of one kind, or all) and the number of requests that started there."
    busy, n = 0.0, 0
    for log in logs:
        for k, t0, t1 in log:
            if what and k != what: continue
            busy += max(0.0, min(t1, b) - max(t0, a))
            n += a <= t0 <= b
    return busy, n


def peak(logs: list, a: float, b: float) -> int:
    "The most requests served at once inside [a, b], over all replicas."
    spans = [(t0, t1) for log in logs for _, t0, t1 in log if t1 >= a and t0 <= b]
    ev = sorted([(t0, 1) for t0, _ in spans] + [(t1, -1) for _, t1 in spans])
    now = best = 0
    for _, d in ev:
        now += d
        best = max(best, now)
    return best


def make_data(root: Path, n_videos: int, captions: list[int]) -> tuple[list, dict]:
    "Question videos (30 s each) and one caption video per caption count (2-s fixed chunks)."
    from reveal_kit.testing.videos import make_test_video
    qv = [make_test_video(root / f'qv{i}.mp4', [(6, 7 * i + j) for j in range(5)], fps=2, size=(160, 120))
          for i in range(n_videos)]
    cv = {n: make_test_video(root / f'cv{n}.mp4', [(8, 3 + j) for j in range(max(1, n // 4))], fps=2,
                             size=(160, 120)) for n in sorted(set(captions))}
    return qv, cv


PER_VIDEO = 8

def questions(videos: list[Path], n: int) -> list:
    "`n` questions, `PER_VIDEO` in a row on each video (the runner loads a video's memory once for its questions)."
    from reveal_kit.core import Question
    opts = {'A': 'a red door opens', 'B': 'a blue car passes', 'C': 'a person reads', 'D': 'nothing changes'}
    return [Question(f'q{i:04d}', v.stem, f'What happens around second {3 * i % 30} of {v.stem} (variant {i})?',
                     opts, 'ABCD'[i % 4], video_path=str(v), duration=30.0)
            for i, v in ((i, videos[(i // PER_VIDEO) % len(videos)]) for i in range(n))]


def caption_config():
    "The memory settings of the caption runs: 2-s fixed chunks, so a video of 2n seconds gets n captions."
    from reveal_kit.core import Config
    return Config(chunking='fixed', fixed_chunk_s=2.0)


def template(video: Path, root: Path, url: str) -> Path:
    "A finished build of `video` whose frame pass (segments) later builds resume from."
    from reveal_kit.backends.http import OpenAIHTTPModel
    from reveal_kit.memory.store import OfflineMemory
    import reveal_kit.memory.build  # noqa: F401  (adds OfflineMemory.build)
    out = root / f'template-{video.stem}'
    OfflineMemory.build(video, out, caption_config(), chat_model=OpenAIHTTPModel(url, model=MODEL), progress=False,
                        concurrency=8)
    return out


def caption_run(tpl: Path, video: Path, out: Path, urls: list[str], conc: int, reps) -> dict:
    "Stages 2-4 of a build resumed from the template's frame pass, with `conc` calls in flight."
    from reveal_kit.backends.http import OpenAIHTTPModel
    from reveal_kit.memory.store import OfflineMemory
    import reveal_kit.memory.build  # noqa: F401  (adds OfflineMemory.build)
    out.mkdir(parents=True)
    for f in ('build.json', 'segments.json', 'visual.npy'): shutil.copy(tpl / f, out / f)
    t0 = time.monotonic()
    m = OfflineMemory.build(video, out, caption_config(), chat_model=OpenAIHTTPModel(urls, model=MODEL),
                            progress=False, concurrency=conc)
    cap_s, n = m.manifest['timings']['caption_s'], m.manifest['counts']['n_l1']
    assert m.manifest['caption_fallbacks'] == 0, 'a caption call failed'
    busy, _ = served([r.log() for r in reps], t0, time.monotonic(), 'caption')
    return dict(captions=n, caption_s=cap_s, caps_per_s=n / cap_s, cap_inflight=busy / cap_s)


def reveal_run(qs: list, out: Path, urls: list[str], conc: int, reps) -> dict:
    "`reveal` over `qs` through the runner with `conc` questions at once."
    from reveal_kit.eval.runner import run_eval
    c0 = time.process_time()
    s = run_eval(qs, 'reveal', out, backend='http', base_url=','.join(urls), concurrency=conc, cache_mode='off',
                 progress=False)
    b = time.monotonic()
    a, logs = b - s['seconds'], [r.log() for r in reps]
    busy, n = served(logs, a, b)
    assert s['ran'] == len(qs) and s['failed'] == 0, s
    return dict(questions=s['ran'], q_seconds=s['seconds'], q_per_s=s['ran'] / s['seconds'],
                req_per_q=n / s['ran'], q_inflight=busy / s['seconds'], q_peak=peak(logs, a, b),
                cpu_per_q=(time.process_time() - c0) / s['ran'])


def main():
    if sys.argv[1:2] == ['--serve']: return serve(float(sys.argv[2]), int(sys.argv[3]))
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--latency', type=float, default=0.5, help='seconds the stub takes per request')
    ap.add_argument('--replica-slots', type=int, default=8, help='requests one replica serves at once (0: no cap)')
    ap.add_argument('--questions', type=int, default=96, help='most questions per setting (3 x concurrency, >= 4)')
    ap.add_argument('--captions', type=int, default=128, help='most captions per setting (4 x concurrency, >= 8)')
    ap.add_argument('--concurrency', default='1,4,16,64')
    ap.add_argument('--replicas', default='1,3')
    ap.add_argument('--videos', type=int, default=4, help='question videos')
    ap.add_argument('--out', type=Path, default=None, help='work directory (default: a temporary one)')
    ap.add_argument('--keep', action='store_true', help='keep the work directory')
    a = ap.parse_args()
    concs = [int(x) for x in a.concurrency.split(',')]
    nreps = [int(x) for x in a.replicas.split(',')]
    root = a.out or Path(tempfile.mkdtemp(prefix='throughput-'))
    root.mkdir(parents=True, exist_ok=True)
    os.environ['REVEAL_RUNS'] = str(root / 'runs')                 # memories and runs of this benchmark only
    n_q = {c: min(a.questions, max(4, 3 * c)) for c in concs}
    n_c = {c: min(a.captions, max(8, 4 * c)) for c in concs}
    t_all = time.time()
    qv, cv = make_data(root / 'data', a.videos, list(n_c.values()))
    qs = questions(qv, max(n_q.values()))
    warm = Replica(0.0, 0)                                         # builds memories and templates without waiting
    try:
        from reveal_kit.eval.runner import run_eval
        run_eval(qs[::PER_VIDEO][:len(qv)], 'reveal', root / 'warm', backend='http', base_url=warm.url,
                 concurrency=len(qv), cache_mode='off', progress=False)
        tpl = {n: template(v, root / 'templates', warm.url) for n, v in cv.items()}
    finally:
        warm.stop()
    print(f"data, memories and templates ready in {time.time() - t_all:.0f} s; latency {a.latency:g} s, "
          f"{a.replica_slots or 'unlimited'} slots per replica; load average {os.getloadavg()[0]:.1f}")
    rows = []
    for R in nreps:
        reps = [Replica(a.latency, a.replica_slots) for _ in range(R)]
        urls = [r.url for r in reps]
        try:
            for c in concs:
                cap = min(c, R * a.replica_slots) if a.replica_slots else c
                ideal_req = cap / a.latency
                q = reveal_run(qs[:n_q[c]], root / 'runs_bench' / f'r{R}_c{c}', urls, c, reps)
                k = caption_run(tpl[n_c[c]], cv[n_c[c]], root / 'caps' / f'r{R}_c{c}', urls, c, reps)
                row = dict(replicas=R, concurrency=c, **q, **k, ideal_q=ideal_req / q['req_per_q'],
                           ideal_caps=ideal_req)
                row.update(q_ratio=row['q_per_s'] / row['ideal_q'], cap_ratio=row['caps_per_s'] / ideal_req)
                rows.append(row)
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        finally:
            for r in reps: r.stop()
    print()
    print('| replicas | concurrency | questions | reveal q/s | ideal q/s | ratio | req/q | mean in-flight '
          '| max in-flight | client CPU s/q | captions | captions/s | ideal | ratio | mean in-flight |')
    print('|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
    for r in rows:
        print(f"| {r['replicas']} | {r['concurrency']} | {r['questions']} | {r['q_per_s']:.2f} | {r['ideal_q']:.2f} | "
              f"{r['q_ratio']:.2f} | {r['req_per_q']:.1f} | {r['q_inflight']:.1f} | {r['q_peak']} | "
              f"{r['cpu_per_q']:.3f} | {r['captions']} | {r['caps_per_s']:.1f} | {r['ideal_caps']:.1f} | "
              f"{r['cap_ratio']:.2f} | {r['cap_inflight']:.1f} |")
    print(f"\nlatency {a.latency:g} s, {a.replica_slots} slots per replica; {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the end; total {time.time() - t_all:.0f} s")
    if not (a.keep or a.out): shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
    main()
