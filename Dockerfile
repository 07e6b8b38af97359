# One image for every packyard role (migrate, worker, beat, flower); the command picks the role.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends git build-essential \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY store ./store
COPY workers ./workers
COPY migrations ./migrations
RUN pip install --no-cache-dir ".[postgres]"
ENV PACKYARD_STATE_DIR=/var/lib/packyard
ENTRYPOINT ["packyard"]
