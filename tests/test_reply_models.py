"""Every role's reply schema, now generated from its pydantic model, is the schema the servers saw before.

`tests/data/reply_schemas.json` was written by `tools/snapshot_reply_schemas.py` from the dict literals the roles held
before the reply models. The comparison is exact, key order included: `schema_instruction` prints the schema into the
prompt and the call cache keys on it, so any difference would change prompts and miss every cached call."""
import json
from pathlib import Path

import pytest
from reply_schema_cases import cases

from reveal_kit.backends.replies import bound_schema

SNAPSHOT = json.loads((Path(__file__).parent / 'data' / 'reply_schemas.json').read_text())
CASES = cases()


def test_every_snapshot_has_a_case():
    assert sorted(CASES) == sorted(SNAPSHOT)


@pytest.mark.parametrize('name', sorted(SNAPSHOT))
def test_schema_text_unchanged(name):
    new = CASES[name]()
    assert json.dumps(new) == json.dumps(SNAPSHOT[name])                    # same text, key order included
    assert json.dumps(bound_schema(new)) == json.dumps(bound_schema(SNAPSHOT[name]))
