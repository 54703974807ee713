#!/usr/bin/env bash
# Build a Horovod 0.28.1 wheel for this venv's torch, once, and cache it outside the clone.
#
# Horovod's last release compiles as C++14; torch >= 2.1 needs C++17.  We patch the
# standard in its two CMakeLists, build gloo-only (no MPI, no TensorFlow/MXNet) and
# keep the wheel in $RANKWISE_WHEEL_CACHE (default ~/.cache/rankwise/wheels), keyed by
# the torch version and Python tag, so later runs (and other clones) just install it.
#
#   scripts/build_horovod.sh [PYTHON]     # PYTHON defaults to .venv/bin/python
set -euo pipefail
PY=${1:-.venv/bin/python}
VERSION=0.28.1
CACHE=${RANKWISE_WHEEL_CACHE:-$HOME/.cache/rankwise/wheels}
TORCH=$($PY -c 'import torch; print(torch.__version__.replace("+", "_"))')
PYTAG=$($PY -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
DEST="$CACHE/horovod-$VERSION-torch$TORCH-$PYTAG"

if $PY -c 'import horovod.torch' 2>/dev/null; then
  echo "horovod already importable in $PY"; exit 0
fi
wheel=$(ls "$DEST"/horovod-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  echo "building horovod $VERSION for torch $TORCH ($PYTAG); takes several minutes on 2 cores" >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  $PY -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$work"
  tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
  src="$work/horovod-$VERSION"
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" || { echo "patch failed" >&2; exit 1; }
  $PY -m pip install -q wheel
  command -v cmake >/dev/null || $PY -m pip install -q cmake
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
         HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO CMAKE_POLICY_VERSION_MINIMUM=3.5 \
         MAKEFLAGS="-j$(nproc)"
  mkdir -p "$DEST"
  $PY -m pip wheel -q --no-build-isolation --no-deps -w "$work/out" "$src"
  mv "$work"/out/horovod-*.whl "$DEST/"
  wheel=$(ls "$DEST"/horovod-*.whl | head -n 1)
  echo "cached $wheel" >&2
fi
$PY -m pip install -q --no-deps "$wheel"
$PY -m pip install -q cloudpickle psutil pyyaml packaging
$PY -c 'import horovod.torch as hvd; print("horovod", __import__("horovod").__version__, "gloo built:", hvd.gloo_built())'
