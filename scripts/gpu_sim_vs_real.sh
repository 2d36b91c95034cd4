#!/usr/bin/env bash
# The simulator against backend=hf on this machine's GPU (python -m repro sim_vs_real), for two of the papers'
# architectures with random weights (no download): Llama-2-7B (TurboSpec, AdaServe) and Qwen2.5-7B (Nightjar), the
# draft a noisy copy of the target (noise 0.05: greedy agreement about 0.6 at 32 layers; 0.3 left none on the H100,
# docs/gpu.md), vLLM, Sarathi-Serve and static k = 3. Each model runs
# under its own time limit; its profile, recordings and report are packed into $OUT/sim_vs_real.tgz as it finishes,
# so a run cut short keeps what it finished. Commit the reports (summary.md, comparison.csv, the figure, the
# profile with its sidecar) under profiles/sim_vs_real/ with the device's name. The backend's tests run on the device
# first (backend-tests.txt in the pack).
# Usage: OUT=/some/folder [GPU_TAG=h100] [ROUNDS=3] [REPEAT=3] [DEADLINE_S=580] [MODELS="llama2-7b qwen2.5-7b"]
#        [SKIP_TESTS=1] bash scripts/gpu_sim_vs_real.sh [quick]
# (ROUNDS: profile sweeps, python -m repro.profile --rounds, each timing a cell REPEAT times (default 7), so a cell's
# median is over ROUNDS x REPEAT passes; DEADLINE_S: the whole script's seconds, each model's limit cut to what is
# left. On an H100 with ROUNDS=3 REPEAT=3 the tests took 90 s and a 7B model's profile 165 s, its three real runs
# about 150 s more: both models do not fit one 10-minute call, so run MODELS=llama2-7b, then on the warm machine
# MODELS=qwen2.5-7b SKIP_TESTS=1)
# quick: the whole pipeline on the tiny stand-ins in seconds (DEVICE=cpu runs it on a CPU).
set -uo pipefail
# shellcheck source=scripts/gpu_lib.sh
. "$(dirname "$0")/gpu_lib.sh"
gpu_setup sim_vs_real /tmp/gpu_sim_vs_real
device="${DEVICE:-cuda}"
tag="${GPU_TAG:-h100}"

run() {  # NAME LIMIT_S ARGS...: one report into $work/$tag-NAME/
    local name=$1 limit=$2; shift 2
    echo "== $name ($(date -u +%T))"
    timeout "$limit" "$py" -m repro sim_vs_real --device "$device" --out "$work/$tag-$name" "$@"
    local rc=$?
    echo "   exit $rc ($(date -u +%T))"
    pack
    return $rc
}

if [ "${1:-}" = quick ]; then
    run tiny 120 --model llama-68m --draft llama-68m --systems vllm static_sd_k3 --num-requests 6
    exit $?  # non-zero: the pipeline does not run here, so a full run would not either
fi
# first, backend=hf's own checks on the device: the KV pool and greedy exactness of every kind of step (float32)
if [ -z "${SKIP_TESTS:-}" ]; then
    echo "== backend tests on $device ($(date -u +%T))"
    REPRO_TEST_DEVICE="$device" timeout 150 "$py" -m pytest -q -p no:cacheprovider -p no:randomly \
        tests/backends/test_kvslots.py tests/backends/test_hf_backend.py > "$work/backend-tests.txt" 2>&1
    echo "   exit $? ($(date -u +%T))"
    tail -3 "$work/backend-tests.txt"
    pack
fi
common=(--no-tiny --threads 0 --systems vllm sarathi static_sd_k3 --num-requests 24 --rps 1 --input-len 256
        --output-len 96 --repeat "${REPEAT:-7}" --draft-noise 0.05 --rounds "${ROUNDS:-1}")
# a 7B model on an H100: its profile (target and draft) about 110 s for 7 passes a cell, 165 s for 3 x 3; its real
# runs about 150 s
lim=$(( 180 + 16 * ${ROUNDS:-1} * ${REPEAT:-7} ))
left() {  # the seconds DEADLINE_S leaves, at most $1
    local rest=$(( ${DEADLINE_S:-100000} - SECONDS ))
    echo $(( rest < $1 ? rest : $1 ))
}
for model in ${MODELS:-llama2-7b qwen2.5-7b}; do
    run "$model" "$(left "$lim")" --model "$model" --draft "$model" "${common[@]}"
done
ls -la "$work"
