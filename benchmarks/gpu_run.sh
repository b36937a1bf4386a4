#!/usr/bin/env bash
# On a GPU machine without this project's environment (the device machine: CUDA and a torch of
# its own, no network): the trainer's CUDA tests, then `python -m benchmarks gpu`. The
# trainer's own dependencies missing there travel as wheels in .whl (pydantic and its four);
# logs and the raw results go to $OUT. DEVICE=cpu is a dry run of the same script on a CPU
# (small runs, nothing written but $OUT).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-run}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
export GPU_BENCH_RAW="$OUT/benchmarks-gpu.json"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:$PWD/trainer_image:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}
{
    nvidia-smi
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
} 2>&1 | tee "$OUT/machine.txt"
# --noconftest: the session hooks install host packages, which needs a network.
started=$SECONDS
parallel=$(python3 -c "import xdist" 2>/dev/null && printf '%s' '-n 8')
timeout "${TESTS_TIMEOUT:-170}" python3 -m pytest -p no:cacheprovider --noconftest -rA $parallel \
    tests/trainer/test_cuda.py 2>&1 | tee "$OUT/tests.log" | tail -40
echo "cuda tests: $((SECONDS - started)) s"
[ -n "${TESTS_ONLY:-}" ] && exit 0
started=$SECONDS
timeout "${BENCH_TIMEOUT:-360}" python3 -m benchmarks gpu --repeats "${REPEATS:-3}" --no-write \
    --device "$DEVICE" >"$OUT/gpu.md" 2>"$OUT/bench.log"
echo "benchmark: exit $?, $((SECONDS - started)) s"
tail -25 "$OUT/bench.log"
cat "$OUT/gpu.md"
