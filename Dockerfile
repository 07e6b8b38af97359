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
# The services run as an unprivileged user that owns only the state dir, the storage root and the
# incoming dir (named volumes mounted there take this ownership when they are created).
RUN useradd --system --user-group --uid 10001 --home-dir /var/lib/packyard --shell /usr/sbin/nologin packyard \
    && mkdir -p /var/lib/packyard /srv/repos /srv/incoming \
    && chown packyard:packyard /var/lib/packyard /srv/repos /srv/incoming \
    && chmod 0700 /var/lib/packyard
ENV PACKYARD_STATE_DIR=/var/lib/packyard \
    PACKYARD_STORAGE_ROOTS=default=/srv/repos \
    PACKYARD_INCOMING_DIR=/srv/incoming
USER packyard:packyard
ENTRYPOINT ["packyard"]
