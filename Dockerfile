# hang-watchdog sidecar image.
#   docker build -t hang-watchdog .
# The same Dockerfile adds the watchdog to a vLLM image for the Kubernetes preflight initContainer
# (it must inspect vLLM's own Python environment):
#   docker build --build-arg BASE_IMAGE=vllm/vllm-openai:<tag> -t hang-watchdog-vllm:<tag> .
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG VERSION=dev
LABEL org.opencontainers.image.title="hang-watchdog" \
      org.opencontainers.image.description="Tells operators that a vLLM server is hung, why, and what to do" \
      org.opencontainers.image.version="${VERSION}"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY watchdog ./watchdog
# Same install as the README; py-spy comes in as a dependency (manylinux wheels for x86_64 and
# aarch64, so Grace hosts work too).
RUN python3 -m pip install . \
    && py-spy --version \
    && hang-watchdog --help > /dev/null \
    && rm -rf /src

# Non-root by default. Attaching py-spy to another container's process needs CAP_SYS_PTRACE in
# the effective set, which runtimes grant only to uid 0 (or the same uid as the target with
# kernel.yama.ptrace_scope=0): the Kubernetes manifest runs this container as the vLLM user
# (root for the upstream vLLM image) with only SYS_PTRACE added. See the README.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin hang-watchdog
USER 10001
WORKDIR /

EXPOSE 9433
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9433/healthz', timeout=4)"]
ENTRYPOINT ["hang-watchdog"]
CMD ["run", "--config", "/etc/hang-watchdog/config.toml"]
