"""One result record for every method (issue 29 item 2) and the marks of every stand-in (issue 34 items 1 and 2)."""
import json
import re
from pathlib import Path

import pytest

from reveal_kit.record import PacePart, Result, RevealPart, BaselinePart
from reveal_kit.eval.metrics import load_results, report
from reveal_kit.eval.runner import run_eval

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope='module')
def bench(tmp_path_factory):
    "One tiny generated benchmark (one video, two questions) for the module."
    from reveal_kit.synth.bench import generate_benchmark
    root = tmp_path_factory.mktemp('bench')
    generate_benchmark(root, minutes=0.5, videos=1, questions_per_video=2, seed=2, split='test', progress=False)
    return root


def packed_rows() -> list[dict]:
    "REVEAL rows written before the record existed (the demo pack's reveal run, as committed before the record)."
    text = (ROOT / 'tests' / 'data' / 'results_before_the_record.jsonl').read_text()
    return [json.loads(l) for l in text.splitlines() if l.strip()]


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


# ---------------------------------------------------------------- stand-ins marked, counted and limited (issue 34)

def instance(s: dict, avoid: str = 'Finish'):
    "A minimal reply that fits a JSON schema (a union: its first member that is not a call of `avoid`)."
    if 'anyOf' in s or 'oneOf' in s:
        opts = s.get('anyOf') or s.get('oneOf')
        keep = [o for o in opts if (o.get('properties', {}).get('tool') or {}).get('enum') != [avoid]]
        return instance((keep or opts)[0], avoid)
    if 'enum' in s: return s['enum'][0]
    if 'const' in s: return s['const']
    t = s.get('type')
    t = t[0] if isinstance(t, list) else t
    if t == 'object' or 'properties' in s:
        return {k: instance(v, avoid) for k, v in s.get('properties', {}).items() if k in s.get('required', [])}
    if t == 'array': return [instance(s.get('items', {}), avoid) for _ in range(max(1, s.get('minItems', 0)))]
    if t == 'string' and 'pattern' in s:
        return next(x for x in ('0:00:00', '00:00:00', '0', 'xxx') if re.fullmatch(s['pattern'], x))
    if t == 'string': return 'x' * max(3, s.get('minLength', 0))
    if t in ('number', 'integer'): return s.get('minimum', 0)
    return False if t == 'boolean' else None


def server(misbehave: dict):
    "A fake OpenAI server: replies that fit each request's schema, except where a system prompt starts as `misbehave`."
    def reply(p):
        first = p['messages'][0]
        system = first['content'] if first['role'] == 'system' and isinstance(first['content'], str) else ''
        for start, bad in misbehave.items():
            if system.startswith(start) and (out := bad(p)) is not None: return out
        if p.get('tools'):              # function calling: the first tool that is not Finish, even when only Finish is offered
            t = next((t['function'] for t in p['tools'] if t['function']['name'] != 'Finish'), None)
            call = {'name': t['name'], 'arguments': instance(t['parameters'])} if t else \
                {'name': 'GlobalBrowse', 'arguments': {'query': 'more'}}
            return {'tool_calls': [call]}
        schema = (p.get('response_format') or {}).get('json_schema', {}).get('schema')
        return json.dumps(instance(schema)) if schema else 'A plain description of the clip.'
    from reveal_kit.testing.fakes import FakeChatServer
    return FakeChatServer(reply, model='m')


def run_cli(bench, out, method, url, *more):
    "`reveal eval run` of one method against the fake server; (exit code, output)."
    from typer.testing import CliRunner
    from reveal_kit.cli.main import app
    r = CliRunner().invoke(app, ['eval', 'run', 'synth', '--method', method, '--root', str(bench), '--out', str(out),
                                 '--backend', 'http', '--base-url', url, '--model', 'm', '--cache', 'off', '--quiet',
                                 *more])
    return r.exit_code, r.output


def report_text(out, *more) -> str:
    from typer.testing import CliRunner
    from reveal_kit.cli.main import app
    return CliRunner().invoke(app, ['eval', 'report', str(out), *more]).output


def marks(out) -> list[set]:
    "Each row's marks as (role, reason, replaced_by) triples."
    return [{(m['role'], m['reason'], m['replaced_by']) for m in r['substitutions']} for r in load_results(out)]


ANSWERER = 'You answer a multiple-choice question about a long video using only the evidence given'
DIRECT = 'You answer a multiple-choice question about a video from frames sampled uniformly'
CUT = lambda p: {'content': '{"answer": "', 'finish_reason': 'length'}


def test_reveal_cut_answerer_is_marked_scored_wrong_and_limited(bench, tmp_path, monkeypatch):
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))
    with server({ANSWERER: CUT}) as srv, pytest.warns(Warning, match=r'answers substituted \(answerer/cut_reply'):
        code, out = run_cli(bench, tmp_path / 'r', 'reveal', srv.url)        # the run ends with one warning line
        assert code == 0, out
        rows = load_results(tmp_path / 'r')
        assert all(('answerer', 'cut_reply', 'offline answer') in m for m in marks(tmp_path / 'r'))
        assert all(r['answer_source'] == 'substituted' and r['correct'] is False for r in rows)
        rep = report_text(tmp_path / 'r')
        assert f'{len(rows)} of {len(rows)} answers substituted (answerer/cut_reply {len(rows)}' in rep, rep
        assert 'accuracy 0.0 %' in rep and 'counted as wrong' in rep
        assert 'left out of accuracy' in report_text(tmp_path / 'r', '--substituted', 'exclude')
        code, out = run_cli(bench, tmp_path / 'r2', 'reveal', srv.url, '--max-substituted', '0.5')
    assert code == 2 and 'above --max-substituted 0.5' in out, out


def test_direct_refused_request_falls_back_marked(bench, tmp_path, monkeypatch):
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))
    with server({DIRECT: lambda p: (400, {'error': 'too many images in the request'})}) as srv:
        code, out = run_cli(bench, tmp_path / 'd', 'direct', srv.url)
        code2, out2 = run_cli(bench, tmp_path / 'd2', 'direct', srv.url, '--max-substituted', '0')
    assert code == 0, out
    assert all(m == {('direct', 'refused_request', 'blind prior')} for m in marks(tmp_path / 'd'))
    n = len(load_results(tmp_path / 'd'))
    assert f'{n} of {n} answers substituted (direct/refused_request {n})' in report_text(tmp_path / 'd')
    assert code2 == 2 and 'above --max-substituted 0' in out2, out2


def test_a_healthy_model_path_run_says_zero_and_an_offline_run_says_offline(bench, tmp_path, monkeypatch):
    import warnings
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))
    with server({}) as srv, warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        code, out = run_cli(bench, tmp_path / 'ok', 'direct', srv.url, '--max-substituted', '0')
    assert code == 0 and not any('substituted' in str(x.message) for x in w), out
    n = len(load_results(tmp_path / 'ok'))
    assert f'0 of {n} answers substituted' in report_text(tmp_path / 'ok')
    run_eval('synth', 'blind', tmp_path / 'off', root=bench, backend='none', progress=False)
    rep = report_text(tmp_path / 'off')
    assert f'offline roles: no model configured ({n} answers)' in rep and 'substituted' not in rep, rep


CLIP = 'You describe one short clip of a long video for a searchable index'
AGENT = 'You answer a multiple-choice question about a long video by calling tools'
NEVER_FINISH = lambda p: json.dumps({'tool': 'GlobalBrowse', 'arguments': {'query': 'more'}})    # not on the last turn
REGISTRY = 'You are given the subject lists recorded for the clips of one video'


def test_pace_index_stand_ins_and_a_missing_finish_are_marked(bench, tmp_path, monkeypatch):
    "PACE: a caption that is not JSON, a cut registry merge, an agent that never calls Finish — each marked."
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))
    seen = {}
    def every_other_clip(p):               # the same clip's repair request fails too
        key = json.dumps(p['messages'][1]['content'])
        seen.setdefault(key, len(seen) % 2 == 0)
        return 'sorry, I cannot describe this' if seen[key] else None
    with server({CLIP: every_other_clip, REGISTRY: CUT, AGENT: NEVER_FINISH}) as srv:
        code, out = run_cli(bench, tmp_path / 'p', 'pace', srv.url)
    assert code == 0, out
    for m in marks(tmp_path / 'p'):
        assert {('pace_caption', 'invalid_json', 'offline caption'), ('pace_registry', 'cut_reply', 'name union'),
                ('pace_index', 'invalid_json', 'lexical tagger'),            # the factor records fell back too
                ('agent', 'missing_finish', 'offline best-supported answer')} <= m, m
    rows = load_results(tmp_path / 'p')
    assert all(r['answer_source'] == 'substituted' and r['correct'] is False and r['degraded'] for r in rows)
    rep = report_text(tmp_path / 'p')
    assert f'{len(rows)} of {len(rows)} answers substituted (' in rep and f'agent/missing_finish {len(rows)}' in rep


def test_dvd_without_finish_has_no_answer_and_no_stand_in(bench, tmp_path, monkeypatch):
    "DVD's code: a run that never calls finish answers with its last message (a tool's result): no letter, no stand-in."
    monkeypatch.setenv('REVEAL_RUNS', str(tmp_path / 'runs'))
    with server({}) as srv:                       # function calling: GlobalBrowse forever, never Finish
        code, out = run_cli(bench, tmp_path / 'v', 'dvd', srv.url, '--max-substituted', '0.2')
    assert code == 0 and 'answers substituted (agent/missing_finish' not in out, out
    rows = load_results(tmp_path / 'v')
    assert rows and all(r['answer'] is None and r['correct'] is False and not r['substitutions'] for r in rows)
    assert all(r['degraded'] and r['stop_reason'] == 'budget' for r in rows)
