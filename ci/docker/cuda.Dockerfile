# llama-server, CUDA backend, built from the pinned llama.cpp source in a container.
#
# Multi-stage: `build` compiles only the llama-server target with the CMake flags the
# harness passes (the native build's flags, BuildRequest.cmake_flags(), with
# -DGGML_CUDA=ON and the GPU architectures); `runtime` holds the static binary. The binary
# still links the CUDA libraries dynamically (ggml links them statically only with
# GGML_STATIC): libcudart, libcublas and libcublasLt come with the runtime stage,
# libcuda.so.1 (the driver) is mounted by the NVIDIA container toolkit when the
# container starts (docker run --gpus ...), and libgomp1 (OpenMP, CPU backend) is
# installed.
#
# Where the toolkit comes from — the one switch, TOOLKIT:
#   base    the bases carry it: NVIDIA's devel and runtime images (the defaults below),
#           for runners that can pull them;
#   debian  the bases are plain Debian 13 with contrib and non-free (`harness base-image
#           --backend cuda`, made locally): the build stage installs Debian's
#           nvidia-cuda-toolkit 12.4 and its host compiler cuda-g++ (g++ 13: trixie's
#           g++ 14 is too new for nvcc 12.4), the runtime stage libcudart12, libcublas12
#           and libcublaslt12. CUDA 12.4 compiles sm_90 and older, not sm_120.
# Either way the runtime stage must not carry a driver library: apt recommends Debian's
# libcuda1 with the CUDA libraries, so nothing is installed with recommends, and the
# last check below fails the build if any libcuda.so.1 is in the image.
#
# The toolkit's driver stub (libcuda.so, which answers every call with "stub library")
# is kept at /opt/harness/cuda-stub/libcuda.so.1, outside the loader's path: nothing
# loads it unless a container is started with LD_LIBRARY_PATH=/opt/harness/cuda-stub,
# which is how the harness produces the "driver is a stub" start on a machine without
# a GPU.
#
# GPU architectures: with GGML_NATIVE=OFF and no -DCMAKE_CUDA_ARCHITECTURES ggml
# compiles its own portable list (ggml-cuda's CMakeLists.txt). `docker build` sees no
# GPU, so a native (-DGGML_NATIVE=ON) request must name the architectures
# (`harness build --cuda-arch`); container_build_args refuses it otherwise.
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
#   TOOLKIT       base (default) or debian, see above
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

# NVIDIA's devel image has nvcc and the CUDA headers and libraries (with the libcuda
# stub to link against); CMake and the host compiler toolchain are added. No git, no
# libssl-dev (LLAMA_OPENSSL=OFF).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
ARG TOOLKIT=base
RUN if [ "$TOOLKIT" = debian ]; then \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            nvidia-cuda-toolkit nvidia-cuda-toolkit-gcc \
        && rm -rf /var/lib/apt/lists/*; \
    elif [ "$TOOLKIT" != base ]; then \
        echo "TOOLKIT must be base or debian, not $TOOLKIT" >&2; exit 1; \
    fi \
    && stub=$(find / -xdev -path '*/stubs/libcuda.so' -print -quit) \
    && test -n "$stub" \
    && mkdir -p /opt/harness/cuda-stub && cp "$stub" /opt/harness/cuda-stub/libcuda.so.1

ARG SOURCE_DIR=llama.cpp
COPY ${SOURCE_DIR} /src

# Declared after the COPY so that other flags reuse the cached layers above. No default:
# the flags live in BuildRequest.cmake_flags() only, and a build without them stops here.
# They are expanded unquoted so each flag is one cmake argument; `set -f` keeps a glob
# character in a flag from matching files. CUDAHOSTCXX (environment, not a flag: the
# native build's flags stay untouched) gives Debian's nvcc the g++ it supports.
ARG CMAKE_FLAGS
RUN : "${CMAKE_FLAGS:?is required: pass BuildRequest.cmake_flags(), see ci/README.md}" \
    && set -f \
    && if [ "$TOOLKIT" = debian ]; then export CUDAHOSTCXX=cuda-g++; fi \
    && cmake -S /src -B /build ${CMAKE_FLAGS} \
    && cmake --build /build --target llama-server --parallel "$(nproc)"

FROM ${RUNTIME_BASE} AS runtime

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
ARG TOOLKIT=base
RUN if [ "$TOOLKIT" = debian ]; then \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            libcudart12 libcublas12 libcublaslt12 \
        && rm -rf /var/lib/apt/lists/*; \
    fi

COPY --from=build /build/bin/llama-server /app/llama-server
COPY --from=build /opt/harness/cuda-stub /opt/harness/cuda-stub

# Fail the image build, naming the library, when the binary needs one the image lacks.
# libcuda.so.1 is the exception: the driver arrives with the GPU when the container
# runs, and the image must not hold one of its own (a driver library that does not
# match the host's kernel module breaks every start).
RUN ! ldd /app/llama-server | grep 'not found' | grep -v 'libcuda\.so\.1' \
    && if ldconfig -p | grep 'libcuda\.so\.1'; then \
         echo "the runtime image holds a driver library (above); the driver must come" \
              "from the host" >&2; exit 1; \
       fi

# No LLAMA_ARG_HOST=0.0.0.0 (llama.cpp's images set it): the harness runs containers on
# host networking and keeps servers on loopback, llama-server's default. No HEALTHCHECK
# either: the harness starts servers with --port 0 and checks readiness itself.
WORKDIR /app
ENTRYPOINT ["/app/llama-server"]
