"""REVEAL loop benchmark: the loop's own time, model calls per role, and a cached rerun.

On the memory of a 60-minute video it measures
1. the loop's own time per question, excluding model calls (target < 50 ms), with the offline roles and with a
   scripted chat model in every role (model time = wall time inside `ChatModel.chat`, subtracted);
2. model calls per question by role (scripted model, which behaves like REVEAL: sufficient after the first repair
   round);
3. a rerun of the same questions through the call cache (`reveal_kit.backends.cache.CachedModel`) — it must make 0 model calls.

Memory: `--memory DIR` loads a built memory (`reveal memory build`); by default a synthetic 60-minute memory
(360 L1 / 30 L2 / 3 L3 narratives with planted events) through `OfflineMemory.from_items` and the packaged text
embedder.

    .venv/bin/python benchmarks/loop_bench.py [--memory DIR] [--repeats 3] [--out runs/bench/loop_bench.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')

from reveal_kit.core import Config, Question, runs_dir
from reveal_kit.reveal.agent import answer_question
from reveal_kit.testing.fakes import synthetic_items
from reveal_kit.reveal.planner import offline_decompose, focus
from reveal_kit.reveal.rubrics import load_rubric_pool, question_type

EVENTS = {
    17: 'the man opens the red door and carries a box inside',
    95: 'at night the man opens the red door to let the cat out',
    230: 'the man opens the red door for a delivery worker with flowers',
    40: 'a chef cuts onions on a wooden board', 130: 'a dog jumps into the swimming pool',
    200: 'a girl plays the violin on stage', 260: 'a mechanic changes the tyre of a blue car',
    300: 'a woman waters the tomato plants', 330: 'the cat knocks a glass off the table',
    60: 'a boy kicks a football against the wall', 160: 'the boy kicks the football over the fence',
}
QUESTIONS = [
    Question('b01', 'syn60', 'How many times does the man open the red door?', ['1', '2', '3', '4'], answer='C'),
    Question('b02', 'syn60', 'How many times does the boy kick the football?', ['1', '2', '3', '4'], answer='B'),
    Question('b03', 'syn60', 'Which of the following is not shown in the video?',
             ['a chef cuts onions', 'a dog jumps into the pool', 'a pilot lands a plane', 'a girl plays the violin'],
             answer='C'),
    Question('b04', 'syn60', 'Which of these does not happen?',
             ['a mechanic changes a tyre', 'a woman waters tomato plants', 'a cat knocks a glass off the table',
              'a man paints a fence'], answer='D'),
    Question('b05', 'syn60', 'In which order do these happen?',
             ['a girl plays the violin, then a dog jumps into the pool',
              'a dog jumps into the pool, then a girl plays the violin'], answer='B'),
    Question('b06', 'syn60', 'In which order do these happen?',
             ['a woman waters the tomato plants, then a chef cuts onions',
              'a chef cuts onions, then a woman waters the tomato plants'], answer='B'),
    Question('b07', 'syn60', 'What does the chef do with the onions?',
             ['cuts them on a board', 'throws them away', 'fries them'], answer='A'),
    Question('b08', 'syn60', 'What does the mechanic do to the blue car?', ['washes it', 'changes a tyre', 'paints it'],
             answer='B'),
    Question('b09', 'syn60', 'What does the cat do?', ['sleeps on the sofa', 'knocks a glass off the table',
                                                       'chases a mouse'], answer='B'),
    Question('b10', 'syn60', 'What does the girl play on stage?', ['the piano', 'the violin', 'the drums'], answer='B'),
]


class TimedEmbedder:
    "Wraps a text embedder and accumulates the wall and CPU time spent encoding."
    def __init__(self, inner):
        self.inner, self.seconds, self.cpu, self.calls = inner, 0.0, 0.0, 0
        self.model_id, self.dim, self.backend = inner.model_id, inner.dim, getattr(inner, 'backend', '')
        self.is_fallback, self.why = getattr(inner, 'is_fallback', False), getattr(inner, 'why', '')

    def encode(self, texts):
        t, c = time.perf_counter(), time.process_time()
        out = self.inner.encode(texts)
        self.seconds += time.perf_counter() - t
        self.cpu += time.process_time() - c
        self.calls += 1
        return out


class CPUTimedModel:
    "Wraps a chat model and accumulates the process CPU time spent inside `chat` (subtracted from the loop's CPU time)."
    def __init__(self, inner):
        self.inner, self.cpu = inner, 0.0

    def __getattr__(self, k):
        return getattr(self.inner, k)

    def chat(self, *a, **k):
        c = time.process_time()
        try:
            return self.inner.chat(*a, **k)
        finally:
            self.cpu += time.process_time() - c


def build_memory(memory_dir: str | None):
    from reveal_kit.memory.store import OfflineMemory
    from reveal_kit.retrieval.choice import get_text_embedder
    te = TimedEmbedder(get_text_embedder())
    if memory_dir:
        mem = OfflineMemory.load(memory_dir, text_embedder=te)
        return mem, te, f'built memory {memory_dir}'
    mem = OfflineMemory.from_items(synthetic_items(360, EVENTS, seed=7), text_embedder=te, video_id='syn60')
    return mem, te, 'synthetic 60-min narratives (360 L1 / 30 L2 / 3 L3) via OfflineMemory.from_items'


def scripted_fn(questions: list[Question], counter: dict):
    "A deterministic stand-in for an LLM in every role (counts the calls that actually reach it)."
    by_text = {q.question + '\n' + q.options_text(): q for q in questions}
    pool = load_rubric_pool()

    def fn(messages, schema, role):
        counter[role] = counter.get(role, 0) + 1
        content = messages[-1]['content']
        user = content if isinstance(content, str) else str(content)
        q = next((q for k, q in by_text.items() if k.split('\n')[0] in user), questions[0])
        if role == 'planner_decompose':
            return {'queries': offline_decompose(q), 'reasoning': 'split the question'}
        if role == 'verifier_select':
            return {'criteria': [c.name for c in pool.for_type(question_type(q))]}
        if role == 'verifier':
            n_ev = user.count('\n[')
            row = schema['properties']['rubric_criteria_scores']['properties']
            z = 1 if n_ev >= 12 else 0.5
            return {'rubric_criteria_scores': {o: {c: z for c in r['properties']} for o, r in row.items()},
                    'unknown_options': [] if z == 1 else list(row),
                    'missing_evidence_analysis': [] if z == 1 else [f'more about {focus(q.question)}']}
        if role == 'planner':
            return {'strategy': 'Text Retrieval', 'queries': [f'{focus(q.question)} later in the video'],
                    'reasoning': 'fill the gap'}
        if role == 'reranker':           # one rubric-rerank call per round: every candidate partial, ties by retrieval
            return {'scores': {k: 0.5 for k in schema['properties']['scores']['required']}}
        return {'answer': q.answer or 'A', 'reasoning': 'scripted'}
    return fn


def run_set(questions, mem, model, roles, te, repeats=1):
    rows = []
    for q in questions:
        for _ in range(repeats):
            e0, ec0, m0, c0 = te.seconds, te.cpu, getattr(model, 'cpu', 0.0), time.process_time()
            r = answer_question(q, mem, model, Config(), 'reveal', roles=roles)
            cpu = time.process_time() - c0 - (getattr(model, 'cpu', 0.0) - m0)
            rows.append(dict(qid=q.qid, loop_ms=1000 * r['loop_seconds'], embed_ms=1000 * (te.seconds - e0),
                             model_ms=1000 * r['model_seconds'], loop_cpu_ms=1000 * cpu,
                             embed_cpu_ms=1000 * (te.cpu - ec0), rounds=r['rounds'], llm_calls=r['llm_calls'],
                             cache_hits=r['cache_hits'], calls_by_role=r['calls_by_role'], correct=r['correct'],
                             stop=r['stop_reason']))
    return rows


def summarize(rows):
    lm = [r['loop_ms'] for r in rows]
    em = [r['embed_ms'] for r in rows]
    roles: dict[str, float] = {}
    for r in rows:
        for k, v in r['calls_by_role'].items():
            roles[k] = roles.get(k, 0) + v / len(rows)
    return dict(n=len(rows), loop_ms_mean=statistics.mean(lm), loop_ms_median=statistics.median(lm),
                loop_ms_max=max(lm), loop_ms_excl_embedding_mean=statistics.mean(a - b for a, b in zip(lm, em)),
                embed_ms_mean=statistics.mean(em), loop_cpu_ms_mean=statistics.mean(r['loop_cpu_ms'] for r in rows),
                loop_cpu_ms_excl_embedding_mean=statistics.mean(r['loop_cpu_ms'] - r['embed_cpu_ms'] for r in rows),
                rounds_mean=statistics.mean(r['rounds'] for r in rows),
                llm_calls_mean=statistics.mean(r['llm_calls'] for r in rows),
                cache_hits_mean=statistics.mean(r['cache_hits'] for r in rows), calls_per_role=roles,
                accuracy=statistics.mean(bool(r['correct']) for r in rows),
                stops={s: sum(r['stop'] == s for r in rows) for s in {r['stop'] for r in rows}})


def print_report(out: dict, mem_desc: str, te, p: Path) -> None:
    print(f"memory: {mem_desc}; items L1/L2/L3 = {out['n_items']}; text embedder {te.model_id} ({te.backend}); "
          f"{os.cpu_count()} CPUs, load {out['load_average'][0]:.1f}")
    print("loop time per question excluding model calls: wall ms (mean/median/max, and without query/option "
          "embedding) and CPU ms")
    print(f"{'run':16} {'wall mean':>9} {'median':>8} {'max':>8} {'-embed':>7} {'cpu':>7} {'cpu-emb':>7} "
          f"{'rounds':>7} {'calls/q':>8} {'made':>5}  calls per role")
    for k in ('offline_roles', 'scripted_model', 'cached_rerun'):
        s = out[k]
        print(f"{k:16} {s['loop_ms_mean']:9.1f} {s['loop_ms_median']:8.1f} {s['loop_ms_max']:8.1f} "
              f"{s['loop_ms_excl_embedding_mean']:7.1f} "
              f"{s['loop_cpu_ms_mean']:7.1f} {s['loop_cpu_ms_excl_embedding_mean']:7.1f} "
              f"{s['rounds_mean']:7.2f} {s['llm_calls_mean']:8.2f} {str(s.get('model_calls_made', 0)):>5}  "
              + ', '.join(f"{r}={v:.2f}" for r, v in sorted(s['calls_per_role'].items())))
    print(f"offline-roles accuracy {out['offline_roles']['accuracy']:.2f}, stops {out['offline_roles']['stops']}; "
          f"written {p}")
    s = out['offline_roles']
    ok = 'yes' if s['loop_ms_median'] < 50 else 'NO'
    print(f"loop overhead including query encoding, per question: {s['loop_ms_median']:.1f} ms wall (median), "
          f"{s['loop_cpu_ms_mean']:.1f} ms CPU (mean); target < 50 ms: {ok}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--memory', default=None, help='a built memory directory (default: synthetic 60-min narratives)')
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--out', default=None, help='JSON output (default runs/bench/loop_bench.json)')
    a = ap.parse_args(argv)
    from reveal_kit.backends.chat import ScriptedModel
    from reveal_kit.backends.cache import CallCache, CachedModel
    mem, te, mem_desc = build_memory(a.memory)
    qs = QUESTIONS if not a.memory else [Question(q.qid, mem.video_id, q.question, q.options) for q in QUESTIONS]
    answer_question(qs[0], mem, None, Config(), 'reveal')                       # warm-up (embedder load, indices)
    out = dict(memory=mem_desc, n_items=[len(mem.level(l)) for l in (1, 2, 3)], text_embedder=te.model_id,
               text_backend=te.backend, cpu=os.cpu_count())
    out['offline_roles'] = summarize(run_set(qs, mem, None, 'offline', te, a.repeats))
    counter: dict = {}
    with tempfile.TemporaryDirectory() as d:
        scripted = ScriptedModel(scripted_fn(qs, counter))
        cached = CPUTimedModel(CachedModel(scripted, CallCache(Path(d) / 'calls'), mode='readwrite'))
        out['scripted_model'] = summarize(run_set(qs, mem, cached, 'model', te))
        out['scripted_model']['model_calls_made'] = sum(counter.values())
        counter.clear()
        out['cached_rerun'] = summarize(run_set(qs, mem, cached, 'model', te))
        out['cached_rerun']['model_calls_made'] = sum(counter.values())
    p = Path(a.out) if a.out else runs_dir() / 'bench' / 'loop_bench.json'
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(out, indent=1))
    out['load_average'] = os.getloadavg()
    print_report(out, mem_desc, te, p)
    if out['cached_rerun']['model_calls_made'] != 0:
        sys.exit('cached rerun made model calls')
    return out


if __name__ == '__main__':
    main()
