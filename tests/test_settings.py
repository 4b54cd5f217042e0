"Settings in sections, one run-settings model, induction's own entry, `ask` through the method registry (issue 29)."
import dataclasses
import json

import pytest
from typer.testing import CliRunner

from reveal_kit.core import Config, load_config
from reveal_kit.settings import SECTIONS, RevealSection
from reveal_kit.eval.methods import register_method
from reveal_kit.eval.metrics import load_results
from reveal_kit.eval.runner import RunSettings, run_eval
from reveal_kit.testing.annotation_files import write_fixture
from reveal_kit.testing.runs import toy_questions


@register_method('_reads_config')
def _reads_config(q, ctx):
    "A method that answers A and records the config values it was given."
    return {'answer': 'A', 'tau': ctx.config.tau, 'pace_fps': ctx.config.pace_fps, 'K': ctx.config.max_rounds}


def cli(*args):
    from reveal_kit.cli.main import app
    return CliRunner().invoke(app, [str(a) for a in args])


def test_section_keys_and_flat_keys_reach_the_method(tmp_path):
    "`--set reveal.tau=0.6 --set pace.pace_fps=3` and the old flat `--set max_rounds=2` reach the method's config."
    root = write_fixture('synth', tmp_path / 'data')
    r = cli('eval', 'synth', '--method', '_reads_config', '--root', root, '--backend', 'none', '--quiet', '--limit', 1,
            '--out', tmp_path / 'run', '--set', 'reveal.tau=0.6', '--set', 'pace.pace_fps=3', '--set', 'max_rounds=2')
    assert r.exit_code == 0, r.output
    (row,) = load_results(tmp_path / 'run')
    assert (row['tau'], row['pace_fps'], row['K']) == (0.6, 3.0, 2)


def test_a_section_key_names_the_same_config_and_hash():
    "`reveal.tau` is `tau`: the same Config, so the same hash (run folders and caches keep their keys)."
    assert load_config(None, ['reveal.tau=0.6']) == load_config(None, ['tau=0.6'])
    assert load_config(None, ['reveal.tau=0.6']).hash() == Config(tau=0.6).hash()
    assert Config().hash() == 'd5c07c97becd'                       # the paper defaults' key, as before sections
    assert dataclasses.replace(Config(), tau=0.5).tau == 0.5 and Config().reveal.tau == 0.7
    with pytest.raises(KeyError, match=r"unknown Config keys: \['pace.tau'\]"):
        Config().replace(**{'pace.tau': 0.5})                   # a field in another section is no key


def test_each_field_carries_type_range_and_reference():
    "Every Config field is declared in one section, with a description; ranges are the model's."
    names = [n for s in SECTIONS.values() for n in s.model_fields]
    assert names == [f.name for f in dataclasses.fields(Config)]
    assert all(f.description for s in SECTIONS.values() for f in s.model_fields.values())
    with pytest.raises(ValueError, match=r'^Config.tau must be in \[0, 1\], got 1.5$'):
        RevealSection.check({'tau': 1.5})


@pytest.mark.parametrize('key, line', [('reveal.tau=1.5', 'error: Config.tau must be in [0, 1], got 1.5'),
                                       ('max_rounds=0', 'error: Config.max_rounds must be at least 1, got 0'),
                                       ('thinking=maybe', "error: Config.thinking must be one of 'auto', 'on' or "
                                                          "'off', got 'maybe'"),
                                       ('reveal.nope=1', "error: unknown Config keys: ['reveal.nope']")])
def test_a_bad_value_is_one_line_and_exit_2(tmp_path, key, line):
    root = write_fixture('synth', tmp_path / 'data')
    r = cli('eval', 'synth', '--method', 'blind', '--root', root, '--backend', 'none', '--out', tmp_path / 'run',
            '--set', key)
    assert (r.exit_code, r.output.strip().splitlines()) == (2, [line]), r.output


def test_cli_run_eval_and_experiment_share_one_run_settings(tmp_path, monkeypatch):
    "`reveal eval run` hands `run_eval` one RunSettings (the CLI's names mapped); Experiment makes the same model."
    import reveal_kit.eval.ray as ray
    seen = {}
    monkeypatch.setattr(ray, 'run_eval_ray', lambda b, m, out, **kw: seen.update(kw, out=out) or
                        dict(ran=0, skipped_finished=0, failed=0, accuracy=0.0, out_dir=str(out)))
    r = cli('eval', 'synth', '--method', 'blind', '--out', tmp_path / 'o', '--backend', 'none', '--cache', 'off',
            '--timeout', 7, '--set', 'reveal.tau=0.6', '--role-model', 'agent=http://h:1', '--quiet')
    assert r.exit_code == 0, r.output
    s = seen['settings']
    assert isinstance(s, RunSettings)
    assert (s.out_dir, s.cache_mode, s.timeout_s, s.overrides, s.role_models, s.progress) == \
           (tmp_path / 'o', 'off', 7.0, ['reveal.tau=0.6'], {'agent': 'http://h:1'}, False)
    from reveal_kit.eval.figures.experiment import Experiment
    assert Experiment.run_settings.__annotations__['return'] in (RunSettings, 'RunSettings')


def test_run_eval_takes_settings_or_old_keywords(tmp_path):
    "`run_eval(…, settings=RunSettings(…))` and the old keyword names make the same run."
    qs = toy_questions(4)
    s = run_eval(qs, '_reads_config', settings=RunSettings(out=tmp_path / 'a', backend='none', progress=False,
                                                           set_=['reveal.tau=0.4']))
    assert s['ran'] == 4 and {r['tau'] for r in load_results(tmp_path / 'a')} == {0.4}
    assert run_eval(qs, '_reads_config', tmp_path / 'a', backend='none', progress=False, overrides=['tau=0.4'],
                    cache_mode=None)['ran'] == 0                     # the same run: resumed, nothing to do
    assert json.loads((tmp_path / 'a' / 'run.json').read_text())['config']['tau'] == 0.4
    with pytest.raises(ValueError, match='concurrency must be a whole number'):
        run_eval(qs, '_reads_config', tmp_path / 'b', backend='none', concurrency=0)
    assert not (tmp_path / 'b').exists()


def test_run_eval_has_at_most_8_parameters():
    import inspect
    ps = [p for p in inspect.signature(run_eval).parameters.values() if p.kind is not p.VAR_KEYWORD]
    assert len(ps) <= 8


def test_induction_has_its_own_entry(tmp_path, monkeypatch):
    "`reveal rubrics induce` goes through `eval.induce`; the runner no longer starts induction."
    import reveal_kit.eval.runner as runner
    import reveal_kit.eval.induce as induce
    assert not hasattr(runner, 'induce_benchmark') and not hasattr(runner, 'induce')
    seen = {}
    rep = dict(provenance=dict(val_accuracy=0.5, start_val_accuracy=0.25), best_iteration=1, pool='p.yaml',
               filter=dict(candidates=3, kept=2, first={}))
    monkeypatch.setattr(induce, 'induce_benchmark', lambda b, **kw: seen.update(kw, benchmark=b) or rep)
    r = cli('rubrics', 'induce', 'synth', '--out', tmp_path / 'p.yaml', '--limit', 3)
    assert r.exit_code == 0 and (seen['benchmark'], seen['limit']) == ('synth', 3), r.output
    assert '3 questions -> 2 pairs' in r.output


def test_ask_asks_the_method_registry(tmp_path, monkeypatch):
    "`reveal ask` answers with PACE exactly when the registry says the method is PACE's."
    import reveal_kit.eval.methods as methods
    import reveal_kit.cli.runs as runs
    asked = []
    monkeypatch.setattr(methods, 'method_family', lambda name: asked.append(name) or 'pace')
    monkeypatch.setattr(runs, 'ask_pace_method', lambda *a: (dict(failed=False, answer='A'), 'by PACE', ('answer',)))
    (tmp_path / 'v.mp4').write_bytes(b'')
    r = cli('ask', tmp_path / 'v.mp4', '-q', 'Which?', '-o', 'a', '-o', 'b', '--method', 'my-own-method')
    assert (r.exit_code, r.output.strip(), asked) == (0, 'by PACE', ['my-own-method']), r.output
