#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (see tools/gpu/README.md).
#   bash tools/gpu/run_checks.sh [OUT]    # OUT: folder for results.jsonl, checks.log and steps.log (default: ./gpu-out)
# Needs: python3 with CUDA PyTorch and the reference accelerate; wheels of accel's 8 distributions and of
# deepspeed, megatron-core, torchao, bitsandbytes (and their small needs) in .whl/ (tools/gpu/wheels.sh).
set -u
OUT=${1:-${OUT:-./gpu-out}}
mkdir -p "$OUT"
LOG="$OUT/checks.log"
RESULTS="$OUT/results.jsonl"
: >"$RESULTS"
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore TOKENIZERS_PARALLELISM=false
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
nvidia-smi -L
python3 -c "import torch, accelerate, accel; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), '| accelerate', accelerate.__version__, '| accel', accel.__version__)"
python3 -c "import deepspeed, torchao, bitsandbytes, megatron.core; print('deepspeed', deepspeed.__version__, 'torchao', torchao.__version__, 'bnb', bitsandbytes.__version__)" 2>&1 | tail -1

step() {  # step NAME TIMEOUT COMMAND...: run, keep its JSON lines, record the outcome
  local name=$1 limit=$2; shift 2
  local start=$(date +%s.%N)
  echo "=== $name: $*"
  local tmp; tmp=$(mktemp)
  timeout "$limit" "$@" >"$tmp" 2>&1
  local rc=$?
  local took; took=$(python3 -c "import time; print(round(time.time()-$start, 1))")
  grep '^{' "$tmp" | while read -r line; do echo "{\"check\": \"$name\", \"rc\": $rc, \"data\": $line}" >>"$RESULTS"; done
  { echo "=== $name (rc=$rc)"; cat "$tmp"; } >>"$OUT/steps.log"  # every step's whole output
  if [ $rc -ne 0 ]; then tail -40 "$tmp"; else grep -v '^{' "$tmp" | tail -8; grep '^{' "$tmp" | cut -c1-600; fi
  echo "{\"check\": \"$name\", \"rc\": $rc, \"seconds\": $took}" >>"$RESULTS"
  echo "--- $name rc=$rc in ${took}s"
}

S=tools/gpu/train_script.py
CHECKS=${CHECKS:-launch loop bigmodel pytest units}
want() { case " $CHECKS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if want launch; then
  for fw in accel accelerate; do
    L=$([ $fw = accel ] && echo "accel launch" || echo "accelerate launch")
    C="--num_processes 1 --num_machines 1 --dynamo_backend no"
    step "single-bf16-$fw" 90 $L $C --mixed_precision bf16 $S --framework $fw
    step "fsdp2-bf16-$fw" 90 $L $C --mixed_precision bf16 --use_fsdp --fsdp_version 2 \
      --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP --fsdp_transformer_layer_cls_to_wrap Block $S --framework $fw
    step "zero3-bf16-$fw" 120 $L $C --mixed_precision bf16 --use_deepspeed --zero_stage 3 --zero3_save_16bit_model true \
      $S --framework $fw
    step "fp8-ao-$fw" 90 $L $C $S --framework $fw --fp8
  done
fi
if want launch-more; then
  for fw in accel accelerate; do
    L=$([ $fw = accel ] && echo "accel launch" || echo "accelerate launch")
    C="--num_processes 1 --num_machines 1 --dynamo_backend no --mixed_precision bf16 --use_fsdp"
    W="--fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP --fsdp_transformer_layer_cls_to_wrap Block"
    step "fsdp2-bf16-$fw" 90 $L $C --fsdp_version 2 $W $S --framework $fw
    step "fsdp1-bf16-$fw" 90 $L $C --fsdp_version 1 $W $S --framework $fw
  done
  step "zero2-fp8-ao-accel" 120 accel launch --num_processes 1 --use_deepspeed --zero_stage 2 $S --framework accel --fp8
fi
want loop && step "train-loop" 150 python3 tools/bench/gpu_train_loop.py --steps 40 --repeats 3
want bigmodel && step "bigmodel" 120 python3 tools/gpu/bigmodel_check.py --repeat 3
want pytest && step "pytest-gpu" 150 python3 -m pytest -q -p no:cacheprovider --timeout 120 -rf \
  packages/accel-train/tests/test_train_megatron.py::test_tiny_gpt_trains_like_plain_pytorch \
  packages/accel-quant/tests/test_bnb_gpu.py
# the CPU-written unit suites of two packages on a machine where CUDA is present: what assumes no GPU
want units && step "units-with-cuda" 150 python3 -m pytest -q -p no:cacheprovider -n 8 --timeout 100 -rf \
  packages/accel-bigmodel/tests packages/accel-data/tests packages/accel-quant/tests packages/accel-state/tests
echo "=== done"
