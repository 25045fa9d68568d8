#!/usr/bin/env bash
# Build llama.cpp's llama-bench and llama-server from the exact llama.cpp
# source that the installed llama-cpp-python bundles (its sdist's
# vendor/llama.cpp), so the reference numbers use the same kernels as zllm's
# llama.cpp backend.
#
#   bench/build_llama_tools.sh [OUT_DIR]     (default /tmp/llama-tools)
#
# Result: OUT_DIR/bin/llama-bench, OUT_DIR/bin/llama-server, OUT_DIR/bin/llama-batched-bench.
# The source and the build stay under OUT_DIR; nothing is committed.
#
# Flags: llama-cpp-python's CMakeLists.txt on Linux only forces
# BUILD_SHARED_LIBS=On, LLAMA_BUILD_COMMON=ON, LLAMA_CURL=OFF and leaves the
# ggml options at llama.cpp's defaults (GGML_NATIVE=ON, GGML_OPENMP=ON,
# GGML_LLAMAFILE=ON, CPU repack); scikit-build-core builds Release.  Its
# llama_print_system_info() on this machine reports AVX512/AVX512_VNNI/
# AVX512_BF16/AVX_VNNI, OPENMP=1, LLAMAFILE=1, REPACK=1.  We pass the same:
# GGML_NATIVE=ON, OpenMP on (default), Release, shared libs.
#
# SERVER_ONLY=1 bench/build_llama_tools.sh [OUT_DIR]: llama-server alone, linked against the libllama / libggml
# that llama-cpp-python installed (LLAMA_PREBUILT_LIB_DIR, default the venv's llama_cpp/lib), so llama.cpp and
# ggml are not compiled again: minutes instead of hours on a 2-core machine, and the server runs the very
# kernels zllm runs. bench/llama_server_prebuilt.patch teaches llama.cpp's CMake that option (the libraries as
# imported targets, no src/ or other tools). Result: OUT_DIR/bin/llama-server (no llama-bench).
#
# PREBUILT=1 TARGETS="llama-bench llama-server" bench/build_llama_tools.sh [OUT_DIR]: the same prebuilt-library
# build for any of those tools (SERVER_ONLY=1 is PREBUILT=1 TARGETS=llama-server). llama-bench links llama,
# ggml and llama-common; LLAMA_PREBUILT_COMMON_LIB=/path/libllama-common.so (e.g. the one an earlier
# SERVER_ONLY build left in OUT_DIR/build-server/bin, copied elsewhere) links that one too, so llama-bench
# compiles one source file; without it llama-common (common/, ~50 files) is compiled first.
set -euo pipefail

OUT=${1:-/tmp/llama-tools}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
JOBS=${JOBS:-2}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PIP=${PIP:-$HERE/.venv/bin/pip}

mkdir -p "$OUT/src"
SDIST="$OUT/src/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  "$PIP" download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$OUT/src"
fi
SRC="$OUT/src/llama_cpp_python-$VERSION"
[ -d "$SRC/vendor/llama.cpp" ] || tar -xzf "$SDIST" -C "$OUT/src"
LLAMA="$SRC/vendor/llama.cpp"

if [ "${SERVER_ONLY:-0}" = 1 ]; then
  PREBUILT=1
  TARGETS=llama-server
fi
if [ "${PREBUILT:-0}" = 1 ]; then
  TARGETS=${TARGETS:-llama-server}
  PY=${PYTHON:-$(dirname "$PIP")/python}
  LIBS=${LLAMA_PREBUILT_LIB_DIR:-$("$PY" -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / "lib")')}
  if ! grep -q LLAMA_PREBUILT_COMMON_LIB "$LLAMA/CMakeLists.txt"; then
    if grep -q LLAMA_PREBUILT_LIB_DIR "$LLAMA/CMakeLists.txt"; then
      echo "$SRC carries an older llama_server_prebuilt.patch: delete it and rerun" >&2
      exit 1
    fi
    patch -d "$LLAMA" -p1 < "$HERE/bench/llama_server_prebuilt.patch"
  fi
  COMMON_ARG=()
  if [ -n "${LLAMA_PREBUILT_COMMON_LIB:-}" ]; then
    COMMON_ARG=(-DLLAMA_PREBUILT_COMMON_LIB="$LLAMA_PREBUILT_COMMON_LIB")
  fi
  cmake -S "$LLAMA" -B "$OUT/build-server" -DLLAMA_PREBUILT_LIB_DIR="$LIBS" "${COMMON_ARG[@]}" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release
  # shellcheck disable=SC2086  # TARGETS is a space-separated list
  cmake --build "$OUT/build-server" --target $TARGETS -j"$JOBS"
  mkdir -p "$OUT/bin"
  for target in $TARGETS; do
    ln -sf "$OUT/build-server/bin/$target" "$OUT/bin/$target"
  done
  case " $TARGETS " in *" llama-server "*) "$OUT/bin/llama-server" --version ;; esac
  case " $TARGETS " in *" llama-bench "*) "$OUT/bin/llama-bench" --help >/dev/null ;; esac
  echo "built: $TARGETS in $OUT/bin (linked against $LIBS ${LLAMA_PREBUILT_COMMON_LIB:-})"
  exit 0
fi

cmake -S "$LLAMA" -B "$OUT/build" \
  -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DGGML_OPENMP=ON \
  -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=Release
# llama-batched-bench: llama.cpp's own aggregate decode of K parallel sequences (the streams reference)
cmake --build "$OUT/build" --target llama-bench llama-server llama-batched-bench -j"$JOBS"

mkdir -p "$OUT/bin"
ln -sf "$OUT/build/bin/llama-bench" "$OUT/bin/llama-bench"
ln -sf "$OUT/build/bin/llama-server" "$OUT/bin/llama-server"
ln -sf "$OUT/build/bin/llama-batched-bench" "$OUT/bin/llama-batched-bench"
"$OUT/bin/llama-bench" --help >/dev/null
echo "built: $OUT/bin/llama-bench $OUT/bin/llama-server"
