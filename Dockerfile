# dragoman in a slim image, running as an unprivileged user.
#   docker build -t dragoman .
#   docker run -p 8765:8765 -v $PWD/dragoman.toml:/etc/dragoman.toml dragoman --config /etc/dragoman.toml --host 0.0.0.0
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 dragoman
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER dragoman
EXPOSE 8765
HEALTHCHECK --interval=30s --timeout=3s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/health')"
ENTRYPOINT ["dragoman", "serve"]
CMD ["--host", "0.0.0.0"]
