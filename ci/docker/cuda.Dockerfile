# llama-server, CUDA backend, built from the pinned llama.cpp source in a container.
#
# Multi-stage: `build` compiles only the llama-server target on NVIDIA's CUDA devel image
# with the CMake flags the harness passes (the native build's flags,
# BuildRequest.cmake_flags(), with -DGGML_CUDA=ON); `runtime` is NVIDIA's CUDA runtime
# image holding the static binary. The binary still links the CUDA libraries
# dynamically (ggml links them statically only with GGML_STATIC): libcudart, libcublas
# and libcublasLt come with the runtime image, libcuda.so.1 (the driver) is mounted by
# the NVIDIA container toolkit when the container starts (docker run --gpus ...), and
# libgomp1 (OpenMP, CPU backend) is installed.
#
# GPU architectures: with GGML_NATIVE=OFF ggml compiles its own portable list (ggml-cuda's
# CMakeLists.txt), exactly as the native build does. `docker build` sees no GPU, so a
# native (-DGGML_NATIVE=ON) request must name -DCMAKE_CUDA_ARCHITECTURES in its flags;
# container_build_args refuses it otherwise.
#
# Build context: a folder holding the llama.cpp tree as ./llama.cpp, which is the layout of
# the harness's source cache entry ($HARNESS_CACHE/source/<digest>/). Nothing is
# downloaded by the build except distribution packages.
#
# Build args:
#   BUILD_BASE    image of the build stage
#                 (default nvidia/cuda:12.8.1-devel-ubuntu24.04)
#   RUNTIME_BASE  image of the runtime stage
#                 (default nvidia/cuda:12.8.1-runtime-ubuntu24.04)
#   CMAKE_FLAGS   required, no default: the -D flags, space separated, from
#                 harness.planning.container_plan.container_build_args
#   SOURCE_DIR    the tree's path inside the build context (default llama.cpp)
#
# Example, as the harness builds (host networking, see ci/README.md):
#   docker build --network host -f ci/docker/cuda.Dockerfile \
#     --build-arg CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Release ... -DGGML_CUDA=ON" \
#     -t llama-server:cuda "$HARNESS_CACHE/source/<digest>"

ARG BUILD_BASE=nvidia/cuda:12.8.1-devel-ubuntu24.04
ARG RUNTIME_BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

FROM ${BUILD_BASE} AS build

# The devel image has nvcc and the CUDA headers and libraries (with the libcuda stub to
# link against); CMake and the host compiler toolchain are added. No git, no libssl-dev
# (LLAMA_OPENSSL=OFF).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential cmake \
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
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*

COPY --from=build /build/bin/llama-server /app/llama-server

# Fail the image build, naming the library, when the binary needs one the image lacks.
# libcuda.so.1 is the exception: the driver arrives with the GPU when the container runs.
RUN ! ldd /app/llama-server | grep 'not found' | grep -v 'libcuda\.so\.1'

# No LLAMA_ARG_HOST=0.0.0.0 (llama.cpp's images set it): the harness runs containers on
# host networking and keeps servers on loopback, llama-server's default. No HEALTHCHECK
# either: the harness starts servers with --port 0 and checks readiness itself.
WORKDIR /app
ENTRYPOINT ["/app/llama-server"]
