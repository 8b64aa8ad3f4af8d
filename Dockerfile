# Images of Troupe's three servers, made of binaries built on the host
# (`cargo build --release`), on a base image given as a build argument: any
# image with a glibc as new as the build host's. compose.yaml builds them;
# by hand:
#
#   docker build --target session --build-arg BASE=debian:bookworm-slim -t troupe-session .
#
# BASE  the base image (default debian:bookworm-slim; with no registry, the
#       image scripts/build-image makes locally, troupe-workspace:latest)
# BIN   where the binaries are, relative to this directory (default
#       target/release)
ARG BASE=debian:bookworm-slim

# The session service, and the operator CLI beside it.
FROM ${BASE} AS session
ARG BIN=target/release
COPY ${BIN}/troupe-session ${BIN}/troupe /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/troupe-session"]

# The runner, with the tools it mounts into workspace containers (the
# supervisor is the runner itself).
FROM ${BASE} AS runner
ARG BIN=target/release
COPY ${BIN}/troupe-runner ${BIN}/troupe-mcp ${BIN}/troupe-demo-agent /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/troupe-runner"]

# The MCP bridge on its shared streamable HTTP endpoint.
FROM ${BASE} AS bridge
ARG BIN=target/release
COPY ${BIN}/troupe-mcp /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/troupe-mcp", "http"]
