#!/usr/bin/env bash
# Fails when nbdev_clean or nbdev_export would change the tree: notebooks must be clean and reveal_kit/ must be
# exactly what the notebooks export. Works on a dirty checkout too (compares before/after snapshots).
set -euo pipefail
# cells without ids get random ones at every export, so the library would never be stable
python3 - <<'PY'
import json, pathlib, sys
bad = [str(p) for p in pathlib.Path('nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in str(p)
       and any('id' not in c for c in json.loads(p.read_text())['cells'])]
if bad: sys.exit('notebooks with cells lacking ids (exports would not be deterministic): ' + ', '.join(bad))
PY
snap() { git status --porcelain --untracked-files=all; git diff; git ls-files --others --exclude-standard -z | xargs -0 -r sha1sum; }
before=$(snap | sha1sum)
nbdev_clean
nbdev_export
after=$(snap | sha1sum)
if [ "$before" != "$after" ]; then
  echo "OUT OF SYNC: nbdev_clean/nbdev_export changed files — run 'make clean-nbs && nbdev_export' and commit:" >&2
  git status --short >&2
  exit 1
fi
echo "notebooks clean and library in sync"
