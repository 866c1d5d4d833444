# One image for every Trainyard service (api, scheduler, worker); the command picks the role.
# CPU torch by default; GPU nodes build with
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
FROM python:3.11-slim

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRAINYARD_DATA_DIR=/data

WORKDIR /app
# Dependencies first so code changes reuse the cached layer.
COPY pyproject.toml constraints.txt README.md ./
RUN mkdir contract dsl workers scheduler api trainyard \
    && pip install --extra-index-url "${TORCH_INDEX_URL}" -c constraints.txt ".[export]" \
    && pip uninstall -y trainyard
COPY contract contract
COPY dsl dsl
COPY workers workers
COPY scheduler scheduler
COPY api api
COPY trainyard trainyard
COPY examples examples
# Editable, so the Alembic migrations (plain files next to the code) are found at start.
RUN pip install --no-deps -e . \
    && useradd --create-home --uid 1000 trainyard \
    && mkdir -p /data \
    && chown trainyard /data
USER trainyard
VOLUME ["/data"]
EXPOSE 8000
CMD ["trainyard", "--help"]
