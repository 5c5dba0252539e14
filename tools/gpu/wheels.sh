#!/usr/bin/env bash
# Fill .whl/ with what tools/gpu/run_checks.sh installs on a GPU machine that cannot reach a registry:
# wheels of accel's 8 distributions (built here) and of the GPU-side libraries for CPython 3.12.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl && mkdir -p .whl
for dist in packages/*/; do uv build -q --wheel --out-dir .whl "$dist"; done
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl \
  megatron-core==0.16.1 torchao==0.18.0 bitsandbytes==0.50.2 hjson pydantic==2.14.4 pydantic-core==2.50.5 \
  annotated-types typing-inspection typing_extensions==4.16.0
# deepspeed publishes an sdist only: build its pure-Python wheel (ops compile on first use); its build
# imports torch, which the constraints pin to the local CPU wheel
python3 -m pip download -q --no-deps --no-binary :all: -d /tmp/deepspeed-sdist deepspeed==0.19.8
DS_BUILD_OPS=0 UV_FIND_LINKS=${UV_FIND_LINKS:-/opt/wheels} uv build -q --wheel --build-constraint tools/constraints.txt \
  --out-dir .whl /tmp/deepspeed-sdist/deepspeed-0.19.8.tar.gz
# bitsandbytes ships a library per CUDA release: keep CUDA 13's and the CPU one (the wheel is 43 MB otherwise)
zip -q -d .whl/bitsandbytes-*.whl 'bitsandbytes/libbitsandbytes_cuda11*' 'bitsandbytes/libbitsandbytes_cuda12*' \
  'bitsandbytes/libbitsandbytes_rocm*' 'bitsandbytes/libbitsandbytes_xpu*' || true
du -sh .whl
