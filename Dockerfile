# The hessviz app under the hosted profile (a public 1 GB / 2-CPU box), installed as a package.
#   docker build -t hessviz .
#   docker run --rm -p 8501:8501 --memory 1g --cpus 2 hessviz
# Raise the limits for a bigger box with -e, e.g. -e HESSVIZ_MEMORY_LIMIT=6GiB -e HESSVIZ_MAX_SECONDS=30.
# HESSVIZ_PROFILE=local (server paths, workstation limits) is for a machine of your own, never a public port.

# Stage 1: the wheel, built from the checkout as `python -m build` builds it (it carries every page's data).
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY . .
RUN pip install --no-cache-dir "build>=1.2" && python -m build --wheel --outdir /dist

# Stage 2: the wheel with its [app] extra beside torch's CPU build; nothing of the checkout.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    HESSVIZ_PROFILE=hosted \
    HESSVIZ_MEMORY_LIMIT=800MiB
COPY --from=wheel /dist /dist
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
        "$(ls /dist/hessviz-*.whl)[app]" \
    && rm -r /dist \
    && useradd --create-home hessviz
USER hessviz
WORKDIR /home/hessviz
EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4)"
# hessviz app serves on loopback unless told: a container's port is published from 0.0.0.0.
CMD ["hessviz", "app", "--server.address=0.0.0.0", "--server.port=8501"]
