"""Offline reader and verifier on a generated benchmark: oracle accuracy, verdict calibration, and (given runs) rounds.

    python benchmarks/reader_bench.py BENCH_ROOT [--memories runs/memories] [--runs RUN_DIR ...]

BENCH_ROOT is a `reveal synth ... --split dev|test` folder whose memories were built (any `reveal eval run synth --root
BENCH_ROOT ...` builds them). For the base presets' memories (fixed 10-s chunks) and REVEAL's (adaptive), it prints,
per question type:
- the reader's accuracy given the decisive segments (the `+oracle` evidence) and how often it says they determine it;
- the offline verifier's verdict (τ = 0.7, the question type's seed rubric) on three evidence sets per question — the
  decisive segments, the decisive segments less one, and the planted misleading segments only — against whether every
  decisive span is in the evidence (calibration), and answer accuracy under sufficient / insufficient verdicts;
- for each RUN_DIR given: accuracy, rounds, stop reasons (run the same method with `--set tau=…`, `--set max_rounds=…`).
"""
from __future__ import annotations
import argparse, glob, json
from collections import Counter, defaultdict
from pathlib import Path
from reveal_kit.core import Evidence
from reveal_kit.memory.store import OfflineMemory
from reveal_kit.eval.loaders import load_synth
from reveal_kit.reveal.agent import oracle_evidence
from reveal_kit.reveal.reader import read_question
from reveal_kit.reveal.offline_checks import EvidenceView
from reveal_kit.reveal.verifier import Verifier
from reveal_kit.reveal.answerer import offline_answer


def overlapping(memory, spans) -> list:
    "L1 items overlapping any of the spans, in time order."
    return [it for it in memory.level(1) if any(min(it.t_end, b) > max(it.t_start, a) for a, b in spans)]


def covers(evidence: list[Evidence], spans) -> bool:
    "Whether every span overlaps some evidence item."
    return all(any(min(e.t_end, b) > max(e.t_start, a) for e in evidence) for a, b in spans)


def evidence_sets(q, memory) -> dict[str, list[Evidence]]:
    "The decisive segments, the same less the one that overlaps the first span most, the misleading segments only."
    items, _ = oracle_evidence(q, memory, 8)
    ev = [Evidence.from_item(it) for it in items]
    a, b = q.evidence_spans[0] if q.evidence_spans else (0, 0)
    drop = max(ev, key=lambda e: min(e.t_end, b) - max(e.t_start, a)) if ev else None
    mis = [Evidence.from_item(it) for it in overlapping(memory, q.distractor_spans) if it.item_id not in
           {e.item_id for e in ev}]
    return {'decisive': ev, 'less_one': [e for e in ev if e is not drop], 'misleading': mis}


def chunking(d: str) -> str:
    "The memory's chunking ('fixed' for base, 'adaptive' for reveal)."
    return json.loads((Path(d) / 'build.json').read_text())['memory_config']['chunking']


def bench(root: str, memories: str, chunk: str) -> None:
    qs, _ = load_synth(root)
    ver = Verifier(offline=True)
    acc, cal = defaultdict(Counter), defaultdict(Counter)
    for q in qs:
        d = [x for x in glob.glob(f'{memories}/{q.video_id}-*')
             if (Path(x) / 'manifest.json').exists() and chunking(x) == chunk]
        if not d: continue
        m = OfflineMemory.load(d[0])
        for name, ev in evidence_sets(q, m).items():
            view = EvidenceView(ev, duration=q.duration)
            if name == 'decisive':
                r = read_question(q, ev, q.duration)
                acc[q.qtype].update(n=1, right=r.answer == q.answer, determined=r.determined)
            rep = ver.verify(q, view)
            right = offline_answer(q, view).answer == q.answer
            full = covers(ev, q.evidence_spans)
            cal[q.qtype].update(**{f'{name}_n': 1, f'{name}_suff': rep.sufficient, 'suff_full': rep.sufficient and full,
                                   'suff': rep.sufficient, 'insuff': not rep.sufficient,
                                   'insuff_notfull': (not rep.sufficient) and not full,
                                   'suff_right': rep.sufficient and right, 'insuff_right': (not rep.sufficient) and right})
    report(acc, cal)


def pct(a, b) -> str: return f'{100 * a / b:5.1f} % ({a}/{b})' if b else '   —'


def report(acc, cal) -> None:
    tot, ctot = sum(acc.values(), Counter()), sum(cal.values(), Counter())
    print('reader given the decisive segments (+oracle evidence):')
    for k, c in sorted(acc.items()) + [('overall', tot)]:
        print(f"  {k:15s} accuracy {pct(c['right'], c['n'])}   determined {pct(c['determined'], c['n'])}")
    print('offline verifier, tau = 0.7 (sufficient verdicts per evidence set):')
    for k, c in sorted(cal.items()) + [('overall', ctot)]:
        sets = '  '.join(f"{s} {pct(c[f'{s}_suff'], c[f'{s}_n'])}" for s in ('decisive', 'less_one', 'misleading'))
        print(f'  {k:15s} {sets}')
    c = ctot
    print(f"  calibration: sufficient → all decisive spans in the evidence {pct(c['suff_full'], c['suff'])}; "
          f"insufficient → a decisive span missing {pct(c['insuff_notfull'], c['insuff'])}")
    print(f"  answer accuracy: under sufficient {pct(c['suff_right'], c['suff'])}; "
          f"under insufficient {pct(c['insuff_right'], c['insuff'])}")


def runs(dirs: list[str]) -> None:
    for d in dirs:
        rows = [json.loads(l) for l in open(Path(d) / 'results.jsonl')]
        cfg = json.loads((Path(d) / 'run.json').read_text()).get('config', {})
        ok = sum(bool(r.get('correct')) for r in rows)
        rounds = Counter(str(r.get('rounds')) for r in rows)
        stops = Counter(r.get('stop_reason') for r in rows)
        print(f"{d}: tau={cfg.get('tau')} K={cfg.get('max_rounds')} accuracy {pct(ok, len(rows))} "
              f"rounds {dict(sorted(rounds.items()))} stops {dict(stops)}")


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('root')
    ap.add_argument('--memories', default='runs/memories')
    ap.add_argument('--runs', nargs='*', default=[])
    a = ap.parse_args()
    for chunk in ('fixed', 'adaptive'):
        print(f'== memories with {chunk} chunking ({"base" if chunk == "fixed" else "reveal"} presets)')
        bench(a.root, a.memories, chunk)
    runs(a.runs)
