#!/usr/bin/env bash
# Fails when nbdev_clean or nbdev_export would change the tree: notebooks must be clean and reveal_kit/ must be
# exactly what the notebooks export; nbs/index.ipynb must be README.md (tools/readme_to_index.py). Works on a dirty checkout too (compares before/after snapshots).
set -euo pipefail
# cells without ids get random ones at every export, so the library would never be stable
python3 - <<'PY'
import json, pathlib, sys
bad = [str(p) for p in pathlib.Path('nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in str(p)
       and any('id' not in c for c in json.loads(p.read_text())['cells'])]
if bad: sys.exit('notebooks with cells lacking ids (exports would not be deterministic): ' + ', '.join(bad))
# every module must come from a notebook that still exists (a deleted or renamed notebook leaves a stale module)
import re
stale = []
for m in pathlib.Path('reveal_kit').rglob('*.py'):
    if m.name in ('__init__.py', '_modidx.py'): continue
    src = re.search(r'File to edit: (?:\.\./)+(nbs/\S+\.ipynb)', m.read_text())
    if not src or not pathlib.Path(src.group(1)).exists(): stale.append(m.name)
if stale: sys.exit('modules exported by no notebook (delete them): ' + ', '.join(sorted(stale)))
PY
snap() { git status --porcelain --untracked-files=all; git diff; git ls-files --others --exclude-standard -z | xargs -0 -r sha1sum; }
before=$(snap | sha1sum)
python3 tools/readme_to_index.py
nbdev_clean
nbdev_export
after=$(snap | sha1sum)
if [ "$before" != "$after" ]; then
  echo "OUT OF SYNC: nbdev_clean/nbdev_export changed files — run 'make clean-nbs && nbdev_export' and commit:" >&2
  git status --short >&2
  exit 1
fi
echo "notebooks clean and library in sync"
