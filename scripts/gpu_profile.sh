#!/usr/bin/env bash
# Profile the papers' model architectures with random weights on this machine's GPU (python -m repro.profile), in
# order of use, each model under its own time limit; the profiles, their provenance and a short device check (bf16
# matrix throughput, copy bandwidth, nvidia-smi) are packed into $OUT/profiles.tgz after each model, so a run cut short
# keeps what it finished. Usage: OUT=/some/folder [GPU_TAG=h200] bash scripts/gpu_profile.sh [quick]
# (GPU_TAG names the files, <tag>-<model>.csv; default h100)
set -uo pipefail
# shellcheck source=scripts/gpu_lib.sh
. "$(dirname "$0")/gpu_lib.sh"
gpu_setup profiles /tmp/gpu_profile

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv \
    >"$work/nvidia-smi.csv" 2>&1
"$py" - "$work/device.json" <<'EOF'
import json, sys, torch
d = torch.device("cuda")
a = torch.randn(8192, 8192, device=d, dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(3): a @ b
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): a @ b
e.record(); e.synchronize()
tflops = 10 * 2 * 8192**3 / (s.elapsed_time(e) / 1e3) / 1e12
x = torch.empty(4 << 30, dtype=torch.uint8, device=d); y = torch.empty_like(x)
for _ in range(2): y.copy_(x)
s.record()
for _ in range(10): y.copy_(x)
e.record(); e.synchronize()
gbs = 10 * 2 * x.numel() / (s.elapsed_time(e) / 1e3) / 1e9  # bytes read + written
info = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
        "bf16_matmul_8192_tflops": round(tflops, 1), "copy_gbs_read_plus_write": round(gbs, 1),
        "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}
json.dump(info, open(sys.argv[1], "w"), indent=1); print(info)
EOF
pack

tag="${GPU_TAG:-h100}"
profile() {  # NAME LIMIT_S ARGS...: one model (and its draft) into $work/$tag-NAME.csv
    local name=$1 limit=$2; shift 2
    echo "== $name ($(date -u +%T))"
    timeout "$limit" "$py" -m repro.profile --device cuda --out "$work/$tag-$name.csv" --repeat 7 "$@"
    echo "   exit $? ($(date -u +%T))"
    pack
}

if [ "${1:-}" = quick ]; then  # half a minute: the whole pipeline on a small model
    profile llama-160m 30 --model llama-160m --tokens 1 8 --contexts 0 128 --k 1 --batches 1 8 --mixed --chunks 64 \
        --decodes 4 -v
    exit 0
fi
ctx="0 64 128 512 1024 2048"
# TurboSpec and AdaServe: Llama-2-7B with its Llama-160M / Llama-68M drafts (docs/calibration.md's H100 anchors)
profile llama2-7b 140 --model llama2-7b --draft llama-160m --contexts $ctx --k 1 3 5 --mixed
# AdaServe Fig. 4's middle case: Llama-2-13B with Llama-68M (added on the second lent H100, 2026-11-27)
profile llama2-13b 130 --model llama2-13b --draft llama-68m --contexts $ctx --k 1 3 5 --mixed
# Nightjar: Qwen2.5-7B with Qwen2.5-0.5B
profile qwen2.5-7b 100 --model qwen2.5-7b --draft qwen2.5-0.5b --contexts $ctx --k 1 3 5
# SpecDecode-Bench's target (issue 30): Llama-3.1-8B
profile llama3-8b 60 --model llama3-8b --contexts $ctx --k 1 3
# vLLM V1 validation (issue 30): Qwen3-32B with Qwen3-1.7B; Qwen3-4B as the second draft
profile qwen3-32b 120 --model qwen3-32b --draft qwen3-1.7b --contexts 0 32 128 512 2048 --k 1 3 5
profile qwen3-4b 40 --model qwen3-4b --contexts $ctx
ls -la "$work"
