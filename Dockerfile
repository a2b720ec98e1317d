# kvq serve in a container, built from this repository (Debian 12, as CI builds it):
#   docker build -t kvq .
#   docker run -p 8000:8000 -v $PWD/models:/models kvq -m /models/MODEL.gguf --parallel 4 \
#     --prefix-store redis://redis:6379 --kv-events 'tcp://*:5557' --kv-events-replay 'tcp://*:5558'
# Not built by the test suite (no container runtime there): see docs/scale-out.md for what was tested.
FROM debian:bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config python3 unicode-data \
      libhwy-dev libfmt-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev libcurl4-openssl-dev \
      libhiredis-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The native program only: no browser build, no tests (their npm fixtures need the network).
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVQ_BUILD_WEB=OFF -DKVQ_BUILD_TESTS=OFF -DKVQ_BUILD_BENCH=OFF \
    && ninja -C build kvq

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
      libhwy1 libfmt9 libcpp-httplib0.11 libcurl4 libhiredis0.14 libzmq5 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/kvq /usr/local/bin/kvq
EXPOSE 8000 5557 5558
ENTRYPOINT ["kvq", "serve", "--host", "0.0.0.0", "--port", "8000"]
