"""Write every role's reply schema (with representative arguments) to tests/data/reply_schemas.json, key order kept.

The schema text is part of the prompt (`schema_instruction` prints it as is), so the test compares it exactly."""
import json, sys
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root), str(root / 'tests')]
from reply_schema_cases import cases
from reveal_kit.pace import tools
if not hasattr(tools, 'BROWSE_SCHEMA'):     # before the reply models: GlobalBrowse's schema was written inline
    tools.BROWSE_SCHEMA = {'type': 'object', 'required': ['answer'], 'properties': {'answer': {'type': 'string'}}}

out = {name: f() for name, f in cases().items()}
dest = root / 'tests' / 'data' / 'reply_schemas.json'
dest.write_text(json.dumps(out, indent=1, ensure_ascii=False) + '\n')
print(f"{len(out)} schemas -> {dest}")
