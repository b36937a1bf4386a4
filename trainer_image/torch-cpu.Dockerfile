# A CPU-only PyTorch base for the trainer image's `-cpu` variant (linux/amd64 and linux/arm64):
# slim Python plus torch and torchvision from PyTorch's CPU wheel index, no CUDA libraries. The release workflow
# builds it, then trainer_image/Dockerfile with --build-arg BASE_IMAGE=<this image>.
#   buildah bud -f trainer_image/torch-cpu.Dockerfile --build-arg TORCH_VERSION=2.15.0 -t torch-cpu .
# TORCH_VERSION is the trainer's [torch] extra (`hack/release.py torch-version`). Where the CPU
# index cannot be reached, TORCH_INDEX=https://pypi.org/simple gives PyPI's torch, which on
# x86_64 brings the CUDA libraries along (about 3 GB) and still runs on CPU.
ARG PYTHON_IMAGE=python:3.12.12-slim-trixie
FROM ${PYTHON_IMAGE}
ARG TORCH_VERSION
# torchvision for users' own scripts: the trainer's [torch] extra's pin (tests/unit/test_release.py
# keeps the two in step).
ARG TORCHVISION_VERSION=0.29.2
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
LABEL org.opencontainers.image.title="kube-ddp torch CPU base" \
      org.opencontainers.image.source="https://github.com/kube-ddp/kube-ddp"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN test -n "${TORCH_VERSION}" \
    && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --index-url "${TORCH_INDEX}" \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
    && python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)"
