#!/usr/bin/env bash
# The GPU pass (docs/gpu.md): rankwise on a machine with a CUDA GPU, in one command.
#
#   scripts/gpu_check.sh [STEP ...]      steps: smoke tests speed llama scaling shapes
#                                        (default: smoke tests speed llama)
#
#   smoke    nvidia-smi, versions, imports, one tiny `rankwise train --strategy single` on the GPU
#   tests    pytest tests/gpu (every strategy at world size 1 over NCCL, every precision, resume, tools)
#   speed    scripts/gpu_speed.py: --model base, bf16, seq 128: samples/s, TFLOP/s, MFU, rankwise/plain pairs
#   llama    scripts/gpu_llama.py: Llama 3.2 1B's shape, bf16, 2048 tokens, compiled: MFU, rankwise/plain pairs
#   scaling  `rankwise bench --strategies single-1t,ddp,fsdp,deepspeed-zero2` on N CPU cores with N
#            processes, N in SCALING_NPROCS (default "2 4 8"): scaling efficiency against single-1t
#   shapes   scripts/gpu_shapes.py: the cost of a new sequence length every step
#
# Logs and results go to $OUT (default runs/gpu-check).  On a machine without a package registry,
# wheels carried in .whl/ (ignored by git: .git/info/exclude) are installed first into /tmp/site; a
# session with the device tool runs, from the repository root:
#   run(command="bash scripts/gpu_check.sh smoke tests", carry=[".whl"], timeout_s=600)
# after fetching the wheels here (see `make gpu-wheels`).  The script never changes the GPU's settings.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(smoke tests speed llama)
FAILED=()

say() { printf '\n=== %s (%s)\n' "$*" "$(date +%T)"; }

if compgen -G ".whl/*.whl" >/dev/null; then
    say "installing carried wheels into /tmp/site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# rankwise itself: src/ on the path (works without any build), plus the console script if pip can make it offline.
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
if ! command -v rankwise >/dev/null; then
    if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1; then
        mkdir -p /tmp/rankwise-bin
        printf '#!/bin/sh\nexec %s -m rankwise.cli "$@"\n' "$PY" >/tmp/rankwise-bin/rankwise
        chmod +x /tmp/rankwise-bin/rankwise
        export PATH=/tmp/rankwise-bin:$PATH
        echo "rankwise: src/ on PYTHONPATH, console script shim in /tmp/rankwise-bin"
    fi
fi

step_smoke() {
    nvidia-smi -L || true
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
    "$PY" - <<'EOF' || return 1
import torch, torch.distributed as dist
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None)
print("cuda available", torch.cuda.is_available(), "devices", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
print("nccl available", dist.is_nccl_available(), "cores", len(__import__("os").sched_getaffinity(0)))
import importlib
for name in ("rankwise", "pydantic", "deepspeed", "accelerate", "transformers", "tokenizers", "snownlp"):
    try:
        module = importlib.import_module(name)
        print(f"{name:12} {getattr(module, '__version__', '?'):12} {module.__file__}")
    except Exception as e:  # noqa: BLE001
        print(f"{name:12} MISSING: {e!r}")
EOF
    rankwise --help | head -3 || return 1
    rankwise train --data sentiment --strategy single --model tiny --max-steps 5 --batch-size 16 --json \
        --no-progress --out /tmp/rankwise-smoke --set data.limit=300 --set data.tokenizer=char | tail -1
}

step_tests() {
    local parallel=()
    "$PY" -c "import xdist" 2>/dev/null && parallel=(-n "${GPU_TEST_WORKERS:-4}")
    # GPU_TESTS: a -k expression, to rerun some of them (default: all)
    "$PY" -m pytest tests/gpu -v -rA -p no:cacheprovider "${parallel[@]}" --junitxml="$OUT/gpu-tests.xml" \
        ${GPU_TESTS:+-k "$GPU_TESTS"}
}

step_speed() {
    "$PY" scripts/gpu_speed.py --cli --json-out "$OUT/speed.json"
}

step_shapes() {
    "$PY" scripts/gpu_shapes.py
}

step_llama() {
    # issue 53's goals: MFU >= 40 % of the datasheet at 1B, rankwise / plain >= 0.98 over 3 pairs
    "$PY" scripts/gpu_llama.py --size 1b --length 2048 --batch-size 4 --steps 15 --warmup 3 --pairs 3 \
        --json-out "$OUT/llama.json"
}

step_scaling() {
    local n rc=0 pin
    for n in ${SCALING_NPROCS:-2 4 8}; do
        # On n cores (taskset) the bench's fair split gives each of n ranks one thread, and single n threads:
        # the efficiency against single-1t is then the processes' scaling alone.
        pin=()
        command -v taskset >/dev/null && pin=(taskset -c "0-$((n - 1))")
        say "bench on $n CPU cores: $n processes (${pin[*]:-no taskset})"
        CUDA_VISIBLE_DEVICES="" "${pin[@]}" rankwise bench --strategies single-1t,ddp,fsdp,deepspeed-zero2 --nproc "$n" \
            --no-progress --out "runs/gpu-scaling-$n" --set "data.cache_dir=\"/tmp/rankwise-scaling-cache\"" \
            ${SCALING_SET:-} || rc=1
        cp "runs/gpu-scaling-$n/report.json" "$OUT/scaling-$n.json" 2>/dev/null
        "$PY" - "runs/gpu-scaling-$n/report.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
print("scaling efficiency against single-1t:", json.dumps(report["reading"]["scaling_efficiency"]))
EOF
    done
    return $rc
}

for step in "${STEPS[@]}"; do
    say "$step"
    if ! "step_$step"; then
        FAILED+=("$step")
        echo "step $step FAILED"
    fi
done
say "done; failed steps: ${FAILED[*]:-none}"
[ ${#FAILED[@]} -eq 0 ]
