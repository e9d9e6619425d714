#!/usr/bin/env bash
# The one command to run when an NVIDIA GPU is available (from the repository root or anywhere):
#
#   bash scripts/gpu_check.sh                 # every GPU of this machine: ViT-B/16, bf16
#   bash scripts/gpu_check.sh --tiny          # no GPU (CI, the test suite): tiny model, fp32, 2 gloo processes
#   NPROC=4 bash scripts/gpu_check.sh --batch-size 128 --out gpu_check.json   # options go to gpu_check.py
#
# 1. scripts/gpu_check.py under torchrun: the attention kernel (flash or cuDNN, never math), then 20 training
#    steps of ours and timm's ViT-B/16 with DDP and with FSDP2, eager and torch.compile'd: images/s, MFU against
#    a bf16 matmul measured in the same run, ours/timm.
# 2. train.py through configs/accelerate/fsdp.yaml for a few steps on synthetic data (the real FSDP path:
#    sharded state/, consolidated last/), then evaluate.py on last/: both must finish. GPU_CHECK_TRAIN=0 skips it.
# Expected on one 8-GPU H100/H200 machine: a few minutes, most of it torch.compile. Exit code 0: all passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export KINETO_LOG_LEVEL=${KINETO_LOG_LEVEL:-5}  # the profiler's own start/stop chatter

if ! "$PY" -c "import torch" 2> /dev/null; then
  echo "gpu_check: $(command -v "$PY" || echo "$PY") cannot import torch; activate the project's environment" \
       "or point to its python with PYTHON=/path/to/python bash scripts/gpu_check.sh" >&2
  exit 2
fi
if [[ " $* " == *" -h "* || " $* " == *" --help "* ]]; then
  # Help only: this header, then gpu_check.py's options, printed once (no torchrun, no training).
  sed -n '2,/^set -euo/p' scripts/gpu_check.sh | sed '$d' | sed 's/^# \{0,1\}//'
  echo
  exec "$PY" scripts/gpu_check.py --help
fi

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  NPROC=${NPROC:-$("$PY" -c "import torch; print(torch.cuda.device_count())")}
  PRECISION=bf16
  TRAIN=(--model.name=vit_base_patch16_224 --model.img_size=224 --model.embed_dim=768 --model.depth=12
         --model.num_heads=12 --model.mlp_ratio=4 --data.batch_size=32 --run.max_steps=20
         --data.synthetic_train_size=$((20 * 32 * NPROC)))
else
  NPROC=${NPROC:-2}
  PRECISION=no
  TRAIN=(--model.img_size=32 --model.embed_dim=32 --model.depth=2 --model.num_heads=2 --model.mlp_ratio=2
         --data.batch_size=4 --run.max_steps=2 --data.synthetic_train_size=64)
  [[ " $* " == *" --tiny "* ]] || echo "gpu_check: no CUDA device; add --tiny for the CI-sized check on CPU" >&2
fi
PORT=${MASTER_PORT:-29577}

echo "== 1/2 kernels and throughput ($NPROC processes)"
"$PY" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" scripts/gpu_check.py "$@"

if [[ "${GPU_CHECK_TRAIN:-1}" == 0 ]]; then echo "gpu_check: all passed (step 2 skipped: GPU_CHECK_TRAIN=0)"; exit 0; fi
echo "== 2/2 train.py with configs/accelerate/fsdp.yaml, then evaluate.py on its last/"
RUNS=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$RUNS"' EXIT
"$PY" -m accelerate.commands.launch --config_file configs/accelerate/fsdp.yaml --num_processes "$NPROC" \
  --mixed_precision "$PRECISION" --main_process_port "$((PORT + 1))" train.py \
  --data.dataset=synthetic --data.synthetic_val_size=32 --run.epochs=1 \
  --run.log_every=1 --aug.random_resized_crop=false --run.output_dir="$RUNS" --run.name=fsdp "${TRAIN[@]}"
ls "$RUNS/fsdp/state/"*/pytorch_model_fsdp_0/*.distcp > /dev/null  # the state is FSDP's, sharded
"$PY" evaluate.py --checkpoint "$RUNS/fsdp/last" --out "$RUNS/eval" > "$RUNS/eval.txt"
tail -n 3 "$RUNS/eval.txt"
echo "gpu_check: all passed"
