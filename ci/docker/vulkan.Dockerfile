# llama-server, Vulkan backend, built from the pinned llama.cpp source in a container.
#
# Multi-stage: `build` compiles only the llama-server target with the CMake flags the
# harness passes (the native build's flags, BuildRequest.cmake_flags(), with
# -DGGML_VULKAN=ON); `runtime` holds the static binary, the Vulkan loader (libvulkan1),
# Mesa's Vulkan drivers (mesa-vulkan-drivers: AMD, Intel, and llvmpipe, the software
# device CI can select with GGML_VK_VISIBLE_DEVICES=0) and libgomp1 (OpenMP, CPU backend).
#
# Debian 13 (trixie), because the Vulkan backend does not build against Debian 12's
# Vulkan headers (1.3.239 lacks vk::LayerSettingEXT; measured, see docs/design.md). A runner
# without registry access passes a locally made trixie image (debootstrap --variant=minbase
# trixie, then docker import) as BUILD_BASE and RUNTIME_BASE; every package below is in
# Debian's archive.
#
# Build context: a folder holding the llama.cpp tree as ./llama.cpp, which is the layout of
# the harness's source cache entry ($HARNESS_CACHE/source/<digest>/). Nothing is
# downloaded by the build except Debian packages.
#
# Build args:
#   BUILD_BASE    image of the build stage   (default debian:trixie-slim)
#   RUNTIME_BASE  image of the runtime stage (default debian:trixie-slim)
#   CMAKE_FLAGS   required, no default: the -D flags, space separated, from
#                 harness.planning.container_plan.container_build_args
#   SOURCE_DIR    the tree's path inside the build context (default llama.cpp)
#
# Example, as the harness builds (host networking, see ci/README.md):
#   docker build --network host -f ci/docker/vulkan.Dockerfile \
#     --build-arg CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Release ... -DGGML_VULKAN=ON" \
#     -t llama-server:vulkan "$HARNESS_CACHE/source/<digest>"

ARG BUILD_BASE=debian:trixie-slim
ARG RUNTIME_BASE=debian:trixie-slim

FROM ${BUILD_BASE} AS build

# glslc compiles ggml's shaders to SPIR-V at build time; libvulkan-dev and spirv-headers
# are the headers ggml-vulkan includes. No git, no libssl-dev (LLAMA_OPENSSL=OFF).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential cmake glslc libvulkan-dev spirv-headers \
    && rm -rf /var/lib/apt/lists/*

ARG SOURCE_DIR=llama.cpp
COPY ${SOURCE_DIR} /src

# Declared after the COPY so that other flags reuse the cached layers above. No default:
# the flags live in BuildRequest.cmake_flags() only, and a build without them stops here.
# They are expanded unquoted so each flag is one cmake argument; `set -f` keeps a glob
# character in a flag from matching files.
ARG CMAKE_FLAGS
RUN : "${CMAKE_FLAGS:?is required: pass BuildRequest.cmake_flags(), see ci/README.md}" \
    && set -f \
    && cmake -S /src -B /build ${CMAKE_FLAGS} \
    && cmake --build /build --target llama-server --parallel "$(nproc)"

FROM ${RUNTIME_BASE} AS runtime

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libgomp1 libvulkan1 mesa-vulkan-drivers \
    && rm -rf /var/lib/apt/lists/*

COPY --from=build /build/bin/llama-server /app/llama-server

# Fail the image build, naming the library, when the binary needs one the image lacks.
RUN ! ldd /app/llama-server | grep 'not found'

# No LLAMA_ARG_HOST=0.0.0.0 (llama.cpp's images set it): the harness runs containers on
# host networking and keeps servers on loopback, llama-server's default. No HEALTHCHECK
# either: the harness starts servers with --port 0 and checks readiness itself.
WORKDIR /app
ENTRYPOINT ["/app/llama-server"]
