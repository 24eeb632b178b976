#!/usr/bin/env bash
# Print the path of a llama-cpp-python wheel that runs on this machine, building it once if needed.
#
#   scripts/ensure-llama-wheel.sh [PYTHON]        # PYTHON runs `pip wheel` (default: python3)
#   pip install --find-links "$(dirname "$(scripts/ensure-llama-wheel.sh)")" -e '.[llm]'
#
# llama-cpp-python ships as source and compiles llama.cpp at install time. Built for the build
# machine's own CPU (GGML_NATIVE, the default), it dies with "illegal instruction" on these VMs, so
# it is built for a fixed x86-64 level (AVX, AVX2, FMA, F16C, BMI2) instead. The build takes ~7
# minutes on 2 idle cores (~20 when they are busy), so the wheel is kept in a cache outside any
# clone and reused:
#
#   $OVERNIGHT_WHEEL_CACHE (default /root/.cache/overnight-wheels, or ~/.cache/overnight-wheels)
#
# The version is the pin of the `llm` extra in pyproject.toml. The wheel is built in a temporary
# directory and moved into the cache only when complete (a killed build leaves nothing behind), under
# a lock (two callers at once build it once). Progress goes to stderr; stdout is only the path.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-python3}"
cache="${OVERNIGHT_WHEEL_CACHE:-${HOME:-/root}/.cache/overnight-wheels}"

version="$(sed -n 's/.*"llama-cpp-python\(\[[a-z,]*\]\)\?==\([0-9][0-9.]*\)".*/\2/p' "$here/pyproject.toml" | head -n1)"
if [ -z "$version" ]; then
  echo "ensure-llama-wheel: no llama-cpp-python==VERSION pin in $here/pyproject.toml" >&2
  exit 2
fi

mkdir -p "$cache"
exec 9>"$cache/.llama-cpp-python.lock"
flock 9

find_wheel() {
  local w
  for w in "$cache"/llama_cpp_python-"$version"-*.whl; do
    [ -f "$w" ] || continue
    if "$python" -c 'import sys, zipfile; sys.exit(zipfile.ZipFile(sys.argv[1]).testzip() is not None)' "$w" 2>/dev/null; then
      echo "$w"
      return 0
    fi
    echo "ensure-llama-wheel: $w is corrupt; removing it" >&2
    rm -f "$w"
  done
  return 1
}

if wheel="$(find_wheel)"; then
  echo "ensure-llama-wheel: reusing $wheel" >&2
  echo "$wheel"
  exit 0
fi

tmp="$(mktemp -d "$cache/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "ensure-llama-wheel: building llama-cpp-python==$version (about 7 min on 2 idle cores; log: $tmp/build.log)" >&2
start=$(date +%s)
if ! CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
     FORCE_CMAKE=1 CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
     "$python" -m pip wheel --no-deps --no-cache-dir -w "$tmp" "llama-cpp-python==$version" >"$tmp/build.log" 2>&1; then
  tail -n 40 "$tmp/build.log" >&2
  echo "ensure-llama-wheel: build failed (log above)" >&2
  exit 1
fi
built="$(ls "$tmp"/llama_cpp_python-"$version"-*.whl)"
mv "$built" "$cache/"
wheel="$cache/$(basename "$built")"
echo "ensure-llama-wheel: built $wheel in $(( $(date +%s) - start )) s" >&2
echo "$wheel"
