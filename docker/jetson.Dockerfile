# syntax=docker/dockerfile:1
# edgedeploy Jetson image: on-device engine builds (completing device bundles) and on-device checks for
# Jetson Orin with JetPack 6 (TensorRT 10.3, CUDA 12.6, the `jetson-orin` / `jetson-orin-nano` targets).
# l4t-jetpack carries the whole JetPack user space (CUDA, cuDNN, TensorRT, trtexec), so the engines built
# here match the device's TensorRT. Build and run it ON the Jetson (arm64), with the NVIDIA runtime.
#
#   docker build -f docker/jetson.Dockerfile -t edgedeploy:jetson-jp6 .
#   docker run --rm --runtime nvidia -v "$PWD:/work" -v edgedeploy-cache:/cache edgedeploy:jetson-jp6 doctor
#
# torch2trt (optional): --build-arg INSTALL_TORCH2TRT=1, best with a CUDA-enabled JetPack 6 torch from
# --build-arg TORCH_INDEX_URL=<JetPack 6 wheel index> and matching TORCH_VERSION / TORCHVISION_VERSION.

ARG BASE_IMAGE=nvcr.io/nvidia/l4t-jetpack:r36.4.0

# ---- builder: every dependency as a wheel (nothing of this stage ships) ---------------------------------
FROM ${BASE_IMAGE} AS builder
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# pip reads these from the environment (build arguments are environment variables of RUN steps).
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
# a mirror's own certificate authority (a CA bundle path; bind-mount it into the build)
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_CONSTRAINT=/tmp/constraints.txt
# Ubuntu's package versions on L4T move with security updates; the pinned base image tag is the pin.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-pip \
    && rm -rf /var/lib/apt/lists/*
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
ARG INSTALL_TORCH2TRT=0
# torch2trt: pin a master commit (its newest tag, v0.5.0, predates TensorRT 10 support). 4e820ae3 (2024-05-03,
# "dev_trt_10_refactor") builds with build_serialized_network and sets max_workspace_size only on TensorRT < 10.
ARG TORCH2TRT_REF=4e820ae31b4e35d59685935223b05b2e11d47b03
LABEL org.opencontainers.image.title="edgedeploy (Jetson, JetPack 6, TensorRT 10.3)" \
      org.opencontainers.image.description="On-device TensorRT engine builds for Jetson Orin" \
      io.edgedeploy.targets="jetson-orin,jetson-orin-nano" \
      io.edgedeploy.tensorrt="10.3"
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-pip \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid "${UID}" deploy \
    && useradd --create-home --uid "${UID}" --gid "${UID}" --shell /usr/sbin/nologin deploy \
    && mkdir -p /cache /work/out \
    && chown deploy:deploy /cache /work /work/out
# PIP_BREAK_SYSTEM_PACKAGES: a no-op on L4T's Ubuntu 22.04, needed where the base Python is marked externally
# managed (Ubuntu 24.04, Debian 12); this image exists to run edgedeploy, so installing into it is the intent.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --no-index --find-links /wheels \
        /wheels/edgedeploy-*.whl \
    && deploy --version
# torch2trt compiles against the torch and TensorRT installed above, hence --no-build-isolation.
RUN if [ "${INSTALL_TORCH2TRT}" = "1" ]; then \
        python3 -m pip install --no-cache-dir --no-build-isolation \
            "https://github.com/NVIDIA-AI-IOT/torch2trt/archive/${TORCH2TRT_REF}.tar.gz"; \
    fi
ENV EDGEDEPLOY_CACHE_DIR=/cache \
    PATH="${PATH}:/usr/src/tensorrt/bin" \
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
