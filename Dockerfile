# syntax=docker/dockerfile:1
# edgedeploy desktop-GPU image: the whole pipeline plus TensorRT engine builds and GPU validation for the
# `desktop` target (x86_64 NVIDIA GPU, TensorRT 10.13). The base tag is pinned to the profile's TensorRT
# version: an engine only loads under the TensorRT major.minor that built it (docker/images.toml cites the
# release notes; tests/test_docker_images.py keeps the two in step). Needs the NVIDIA Container Toolkit.
#
#   docker build -t edgedeploy:desktop-trt10.13 .
#   docker run --rm --gpus all -v "$PWD:/work" -v edgedeploy-cache:/cache edgedeploy:desktop-trt10.13 \
#       build -c deploy.toml --target desktop --out out/desktop

ARG BASE_IMAGE=nvcr.io/nvidia/tensorrt:25.08-py3

# ---- builder: every dependency as a wheel (nothing of this stage ships) ---------------------------------
FROM ${BASE_IMAGE} AS builder
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1
# CPU torch is enough: torch only captures/exports and computes the reference; TensorRT does the GPU work.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# pip reads these from the environment (build arguments are environment variables of RUN steps).
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
# a mirror's own certificate authority (a CA bundle path; bind-mount it into the build)
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_CONSTRAINT=/tmp/constraints.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY edgedeploy ./edgedeploy
RUN printf 'torch==%s\ntorchvision==%s\n' "$TORCH_VERSION" "$TORCHVISION_VERSION" > /tmp/constraints.txt \
    && python3 -m pip wheel --wheel-dir /wheels --index-url "$TORCH_INDEX_URL" \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
    && python3 -m pip wheel --wheel-dir /wheels --find-links /wheels /src

# ---- runtime ----------------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
ARG UID=10001
LABEL org.opencontainers.image.title="edgedeploy (desktop GPU, TensorRT 10.13)" \
      org.opencontainers.image.description="PyTorch checkpoint to validated TensorRT engines for x86_64 NVIDIA GPUs" \
      io.edgedeploy.targets="desktop" \
      io.edgedeploy.tensorrt="10.13"
RUN groupadd --gid "${UID}" deploy \
    && useradd --create-home --uid "${UID}" --gid "${UID}" --shell /usr/sbin/nologin deploy \
    && mkdir -p /cache /work/out \
    && chown deploy:deploy /cache /work /work/out
# Into the image's own Python, next to the TensorRT bindings it ships. Ubuntu 24.04 marks that Python
# externally managed; this image exists to run edgedeploy, so installing into it is the intent.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --no-index --find-links /wheels \
        /wheels/edgedeploy-*.whl \
    && deploy --version
ENV EDGEDEPLOY_CACHE_DIR=/cache \
    PATH="${PATH}:/opt/tensorrt/bin:/usr/src/tensorrt/bin" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
USER ${UID}:${UID}
WORKDIR /work
# /cache: content-keyed stage cache shared across builds. No VOLUME at or under /work: a declared volume is
# mounted even below a bind mount of /work (`-v "$PWD:/work"`), and the outputs would vanish into it.
VOLUME ["/cache"]
ENTRYPOINT ["deploy"]
CMD ["doctor"]
