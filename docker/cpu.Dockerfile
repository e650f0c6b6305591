# syntax=docker/dockerfile:1
# edgedeploy CPU image: the host-side stages for every target (export, operator checks, calibration,
# ONNX Runtime builds for the `cpu` target, device bundles for the TensorRT targets). No CUDA, no
# TensorRT, no compiler. Image/target pairing: docker/images.toml and docs/docker.md.
#
#   docker build -f docker/cpu.Dockerfile -t edgedeploy:cpu .
#   docker run --rm -v "$PWD:/work" -v edgedeploy-cache:/cache edgedeploy:cpu build -c deploy.toml --out out/cpu
#
# Behind a mirror: --build-arg BASE_IMAGE=mirror.example/python:3.11-slim-bookworm
#   --build-arg PIP_INDEX_URL=... [PIP_EXTRA_INDEX_URL=... PIP_FIND_LINKS=...] --build-arg TORCH_INDEX_URL=...
# The index arguments exist in the builder stage only: they never reach the shipped image or its history.
# `bash .ci/run --containers` builds this file and runs the demo build in it (docs/docker.md).

ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---- builder: every dependency as a wheel (nothing of this stage ships) ---------------------------------
FROM ${BASE_IMAGE} AS builder
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1
# CPU-only torch: the default PyPI wheels bundle CUDA, gigabytes this image never uses.
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
# The constraints keep the second resolve on the CPU torch wheels already in /wheels.
RUN printf 'torch==%s\ntorchvision==%s\n' "$TORCH_VERSION" "$TORCHVISION_VERSION" > /tmp/constraints.txt \
    && python3 -m pip wheel --wheel-dir /wheels --index-url "$TORCH_INDEX_URL" \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
    && python3 -m pip wheel --wheel-dir /wheels --find-links /wheels /src

# ---- runtime ----------------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
ARG UID=10001
LABEL org.opencontainers.image.title="edgedeploy (cpu)" \
      org.opencontainers.image.description="PyTorch checkpoint to validated ONNX Runtime artifacts and device bundles" \
      io.edgedeploy.targets="cpu" \
      io.edgedeploy.tensorrt="none"
RUN groupadd --gid "${UID}" deploy \
    && useradd --create-home --uid "${UID}" --gid "${UID}" --shell /usr/sbin/nologin deploy \
    && mkdir -p /cache /work/out \
    && chown deploy:deploy /cache /work /work/out
# Install from the builder's wheels only (--no-index): the image holds exactly what was resolved there.
# A Debian-packaged Python marks itself externally managed (the official python images do not); this image
# exists to run edgedeploy, so installing into it is the intent.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --no-index --find-links /wheels \
        /wheels/edgedeploy-*.whl \
    && deploy --version
ENV EDGEDEPLOY_CACHE_DIR=/cache \
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
