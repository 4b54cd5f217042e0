#!/usr/bin/env bash
# From a fresh clone to the demo's table, timed by phase, as a new user on this machine would see it.
#
# Clones the repository (its committed HEAD) into a temporary folder, with a temporary HOME (so the kit's cache,
# ~/.cache/reveal-kit, and Hugging Face's are empty) and an empty PIP_CACHE_DIR / UV_CACHE_DIR, runs `make demo`
# there and stamps every line it prints with the seconds since the start. The phases are read off those lines:
#   venv, torch, deps (the kit's dependencies), synth, memories, questions, report
# and, after the demo, the first `reveal ask` on a video the demo has not seen (which builds its memory).
# It prints a table and keeps the stamped log in the temporary folder (removed unless --keep).
#
#   nice bash benchmarks/fresh_bench.sh [--repo PATH] [--keep] [--per-package] [-- make-args...]
#
# --per-package: afterwards, install every wheel of the demo's install once more, one by one, with no
# dependencies, into an empty venv and print the slowest (download excluded: where install time goes).
# Extra arguments after -- go to make (for example INSTALLER=pip to time pip instead of uv).
set -euo pipefail
REPO=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
KEEP=0; PER=0; MAKEARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --repo) REPO=$2; shift 2;;
    --keep) KEEP=1; shift;;
    --per-package) PER=1; shift;;
    --) shift; MAKEARGS=("$@"); break;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
TMP=$(mktemp -d /tmp/fresh-bench.XXXXXX)
[ $KEEP = 1 ] || trap 'rm -rf "$TMP"' EXIT
export HOME=$TMP/home PIP_CACHE_DIR=$TMP/pip-cache UV_CACHE_DIR=$TMP/uv-cache XDG_CACHE_HOME=$TMP/home/.cache
unset REVEAL_CACHE_DIR HF_HOME VIRTUAL_ENV PYTHONPATH || true
mkdir -p "$HOME"
LOG=$TMP/demo.log
T0=$(date +%s.%N)
stamp() { while IFS= read -r line; do printf '%8.2f %s\n' "$(echo "$(date +%s.%N) - $T0" | bc)" "$line"; done; }

git clone -q "$REPO" "$TMP/repo"
cd "$TMP/repo"
echo "# clone of $(git rev-parse --short HEAD) in $TMP/repo; load $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs" \
  | stamp | tee "$LOG"
# make echoes each command before it runs it: the echoes mark the install phases; the demo prints its own stages
{ make demo "${MAKEARGS[@]}" 2>&1; echo "### demo exit $?"; } | stamp | tee -a "$LOG"
# the first question about a video nobody has seen: one more generated video, with its subtitles beside it
.venv/bin/python - <<'EOF' 2>&1 | stamp | tee -a "$LOG"
from reveal_kit.synth.bench import generate_benchmark
generate_benchmark('runs/ask-bench', minutes=4, videos=1, questions_per_video=1, seed=7, split='test', size=(640, 360))
EOF
V=$(ls runs/ask-bench/videos/*.mp4 | head -1)
echo "### ask start $V" | stamp | tee -a "$LOG"
.venv/bin/reveal ask "$V" -q "What happens first?" -o "A. a scene" -o "B. another scene" 2>&1 | stamp | tee -a "$LOG"
echo "### ask end" | stamp | tee -a "$LOG"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" | stamp | tee -a "$LOG"

python3 - "$LOG" <<'EOF'
import re, sys
rows = [(float(l[:8]), l[9:].rstrip()) for l in open(sys.argv[1]) if re.match(r'^ *\d+\.\d\d ', l)]
marks = [('venv', r'-m venv|uv venv'), ('torch', r'install .*torch=='), ('deps', r'install .*-e \.'),
         ('synth', r'\[1/\d\]'), ('memories', r'\[2/\d\].*memor'), ('questions', r'\[\d/\d\] (method|answering)'),
         ('report', r'\[\d/\d\] (report|comparing|results)'), ('(generate ask video)', r'### demo exit'),
         ('first ask', r'### ask start'), ('end', r'### ask end')]
starts = {}
for name, rx in marks:
    hit = next((t for t, l in rows if re.search(rx, l)), None)
    if hit is not None and name not in starts: starts[name] = hit
order = sorted(starts.items(), key=lambda kv: kv[1])
print('\n| phase | seconds |\n|---|---|')
for (n, t), (_, t2) in zip(order, order[1:]): print(f'| {n} | {t2 - t:.1f} |')
inst = [starts[k] for k in ('venv', 'synth') if k in starts]
if len(inst) == 2: print(f'| **install (venv → first demo line)** | {inst[1] - inst[0]:.1f} |')
if 'synth' in starts and '(generate ask video)' in starts:
    print(f"| **demo work (synth → table)** | {starts['(generate ask video)'] - starts['synth']:.1f} |")
if 'venv' in starts and '(generate ask video)' in starts:
    print(f"| **make demo end to end** | {starts['(generate ask video)'] - rows[0][0]:.1f} |")
print(next((l for t, l in rows if l.startswith('### demo exit')), ''))
EOF

if [ $PER = 1 ]; then
  echo; echo "# per-package install time (no download, no dependencies, one pip call each)"
  .venv/bin/pip freeze --exclude-editable > "$TMP/freeze.txt"
  .venv/bin/pip download -q --no-deps -d "$TMP/wheels" -r "$TMP/freeze.txt" >/dev/null 2>&1 || true
  python3 -m venv "$TMP/v2"
  for w in "$TMP"/wheels/*.whl; do
    s=$(date +%s.%N); "$TMP/v2/bin/pip" install -q --no-deps --no-index "$w" >/dev/null 2>&1 || true
    printf '%6.2f %6.1f MB %s\n' "$(echo "$(date +%s.%N) - $s" | bc)" "$(du -m "$w" | cut -f1)" "$(basename "$w")"
  done | sort -rn | head -25
fi
