#!/usr/bin/env bash
# Fails when nbdev_clean or nbdev_export would change the tree: notebooks must be clean and reveal_kit/ must be
# exactly what the notebooks export. Works on a dirty checkout too (compares before/after snapshots).
set -euo pipefail
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
