"""One result record for every method (issue 29 item 2) and the marks of every stand-in (issue 34 items 1 and 2)."""
import json
import tarfile
from pathlib import Path

import pytest

from reveal_kit.record import PacePart, Result, RevealPart, BaselinePart
from reveal_kit.eval.metrics import load_results, report
from reveal_kit.eval.runner import run_eval

ROOT = Path(__file__).resolve().parent.parent
PACK = ROOT / 'figures' / 'packs' / 'demo.tar.gz'


@pytest.fixture(scope='module')
def bench(tmp_path_factory):
    "One tiny generated benchmark (one video, two questions) for the module."
    from reveal_kit.synth.bench import generate_benchmark
    root = tmp_path_factory.mktemp('bench')
    generate_benchmark(root, minutes=0.5, videos=1, questions_per_video=2, seed=2, split='test', progress=False)
    return root


def packed_rows() -> list[dict]:
    "The rows of the demo pack's REVEAL run, as an older kit wrote them."
    with tarfile.open(PACK) as t:
        f = t.extractfile('runs/eval-reveal/results.jsonl')
        return [json.loads(l) for l in f.read().decode().splitlines() if l.strip()]


def test_old_rows_load_through_the_record_and_keep_every_key():
    rows = packed_rows()
    assert rows and 'answer_source' not in rows[0]                     # written before the record existed
    for row in rows:
        rec = Result.from_row(row)
        assert isinstance(rec.part, RevealPart) and rec.part.rho == row['rho']
        assert (rec.answer_source, rec.substitutions, rec.correct) == ('offline', [], row['correct'])
        again = rec.to_row()
        assert {k: again[k] for k in row} == row                        # nothing lost or changed
        assert Result.from_row(again).to_row() == again


def test_pace_rows_carry_pace_part_and_no_reveal_keys(bench, tmp_path):
    "PACE/DVD results no longer fill REVEAL's keys with None; their record holds the episode in its own part."
    run_eval('synth', 'dvd', tmp_path / 'dvd', root=bench, backend='none', progress=False)
    raw = [json.loads(l) for l in (tmp_path / 'dvd' / 'results.jsonl').read_text().splitlines()]
    assert raw and all('rho' not in r and 'sufficient' not in r for r in raw)
    recs = [Result.from_row(r) for r in raw]
    assert all(isinstance(r.part, PacePart) and r.part.steps >= 1 and r.rounds >= 1 for r in recs)
    assert all(r.answer_source == 'offline' and r.correct == (r.answer == r.gold) for r in recs)
    assert report(load_results(tmp_path / 'dvd'))['steps_mean'] >= 1


def test_baseline_rows_are_records_and_correct_is_scored_once(bench, tmp_path):
    from reveal_kit.core import Question
    from reveal_kit.eval.runner import finalize
    run_eval('synth', 'blind', tmp_path / 'blind', root=bench, backend='none', progress=False)
    raw = [json.loads(l) for l in (tmp_path / 'blind' / 'results.jsonl').read_text().splitlines()]
    assert all(isinstance(Result.from_row(r).part, BaselinePart) and 'rho' not in r for r in raw)
    q = Question('q', 'v', 'Which?', ['a', 'b'], answer='B')
    assert finalize({'answer': 'A', 'correct': True}, q, 'm', 0.1)['correct'] is False   # a method cannot score itself
