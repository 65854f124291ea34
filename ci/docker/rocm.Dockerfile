# llama-server, ROCm (HIP) backend, built from the pinned llama.cpp source in a container.
#
# Multi-stage: `build` compiles only the llama-server target with the CMake flags the
# harness passes (the native build's flags, BuildRequest.cmake_flags(), with
# -DGGML_HIP=ON and the GPU targets); `runtime` holds the static binary. The binary still
# links the ROCm libraries dynamically (ggml-hip cannot be linked statically):
# libamdhip64, libhipblas and librocblas with rocBLAS's kernel files; libgomp1 (OpenMP,
# CPU backend) is installed. The GPU reaches the container at run time (--device
# /dev/kfd --device /dev/dri).
#
# Where ROCm comes from — the one switch, TOOLKIT:
#   base    the bases carry it: AMD's ROCm dev image (the default below; no slim ROCm
#           image carries rocBLAS's kernel files, so the runtime stage uses it too, as
#           llama.cpp's own rocm.Dockerfile does), for runners that can pull it;
#   debian  the bases are plain Debian sid (`harness base-image --backend rocm`, made
#           locally): ggml-hip refuses HIP < 6.1, trixie has 5.7, sid has HIP 6.4 with
#           hipcc on clang 21. The build stage installs hipcc, libamdhip64-dev,
#           libhipblas-dev, librocblas-dev and rocm-cmake, the runtime stage
#           libamdhip64-6, libhipblas2 and librocblas4 (with every gfx target's kernels).
#           (The local sid base tells apt to accept a Release file past its one-week
#           Valid-Until, so a mirror serving a snapshot still works: base_image.py.)
#
# GPU architectures: a native build on a ROCm machine compiles for the GPUs
# rocm_agent_enumerator reports. `docker build` sees no GPU, so AMDGPU_TARGETS is written
# to the file ROCM_TARGET_LST names, which rocm_agent_enumerator then reports instead;
# the CMake flags stay exactly the native ones. A -DAMDGPU_TARGETS=... (or
# -DGPU_TARGETS, -DCMAKE_HIP_ARCHITECTURES) in the request's flags still wins.
#
# Build context: a folder holding the llama.cpp tree as ./llama.cpp, which is the layout of
# the harness's source cache entry ($HARNESS_CACHE/source/<digest>/). Nothing is
# downloaded by the build except distribution packages.
#
# Build args:
#   BUILD_BASE      image of the build stage
#                   (default rocm/dev-ubuntu-24.04:7.2.1-complete)
#   RUNTIME_BASE    image of the runtime stage
#                   (default rocm/dev-ubuntu-24.04:7.2.1-complete)
#   CMAKE_FLAGS     required, no default: the -D flags, space separated, from
#                   harness.planning.container_plan.container_build_args
#   TOOLKIT         base (default) or debian, see above
#   AMDGPU_TARGETS  the GPU architectures to compile for, ';'-separated (default: the
#                   list llama.cpp's rocm.Dockerfile builds for); `harness build
#                   --amdgpu-targets` passes -DGPU_TARGETS in CMAKE_FLAGS instead
#   SOURCE_DIR      the tree's path inside the build context (default llama.cpp)
#
# Example, as the harness builds (host networking, see ci/README.md):
#   docker build --network host -f ci/docker/rocm.Dockerfile \
#     --build-arg CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Release ... -DGGML_HIP=ON" \
#     -t llama-server:rocm "$HARNESS_CACHE/source/<digest>"

ARG BUILD_BASE=rocm/dev-ubuntu-24.04:7.2.1-complete
ARG RUNTIME_BASE=rocm/dev-ubuntu-24.04:7.2.1-complete

FROM ${BUILD_BASE} AS build

# AMD's dev image has ROCm's clang, HIP, hipBLAS and rocBLAS; CMake and the host
# compiler toolchain are added. No git, no libssl-dev (LLAMA_OPENSSL=OFF).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
ARG TOOLKIT=base
RUN if [ "$TOOLKIT" = debian ]; then \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            hipcc libamdhip64-dev libhipblas-dev librocblas-dev rocm-cmake \
        && rm -rf /var/lib/apt/lists/*; \
    elif [ "$TOOLKIT" != base ]; then \
        echo "TOOLKIT must be base or debian, not $TOOLKIT" >&2; exit 1; \
    fi

ARG AMDGPU_TARGETS="gfx908;gfx90a;gfx942;gfx1030;gfx1100;gfx1101;gfx1102;gfx1150;gfx1151;gfx1200;gfx1201"
RUN echo "$AMDGPU_TARGETS" | tr ';' '\n' > /opt/amdgpu-targets.lst

ARG SOURCE_DIR=llama.cpp
COPY ${SOURCE_DIR} /src

# Declared after the COPY so that other flags reuse the cached layers above. No default:
# the flags live in BuildRequest.cmake_flags() only, and a build without them stops here.
# They are expanded unquoted so each flag is one cmake argument; `set -f` keeps a glob
# character in a flag from matching files. HIPCXX and HIP_PATH point CMake's HIP language
# at ROCm's clang (environment, not flags: the native build's flags stay untouched).
ARG CMAKE_FLAGS
RUN : "${CMAKE_FLAGS:?is required: pass BuildRequest.cmake_flags(), see ci/README.md}" \
    && set -f \
    && ROCM_TARGET_LST=/opt/amdgpu-targets.lst HIPCXX="$(hipconfig -l)/clang" \
        HIP_PATH="$(hipconfig -R)" cmake -S /src -B /build ${CMAKE_FLAGS} \
    && cmake --build /build --target llama-server --parallel "$(nproc)"

FROM ${RUNTIME_BASE} AS runtime

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
ARG TOOLKIT=base
RUN if [ "$TOOLKIT" = debian ]; then \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            libamdhip64-6 libhipblas2 librocblas4 \
        && rm -rf /var/lib/apt/lists/*; \
    fi

COPY --from=build /build/bin/llama-server /app/llama-server

# Fail the image build, naming the library, when the binary needs one the image lacks.
RUN ! ldd /app/llama-server | grep 'not found'

# No LLAMA_ARG_HOST=0.0.0.0 (llama.cpp's images set it): the harness runs containers on
# host networking and keeps servers on loopback, llama-server's default. No HEALTHCHECK
# either: the harness starts servers with --port 0 and checks readiness itself.
WORKDIR /app
ENTRYPOINT ["/app/llama-server"]
