# The hessviz app under the hosted profile (a public 1 GB / 2-CPU box).
#   docker build -t hessviz .
#   docker run --rm -p 8501:8501 --memory 1g --cpus 2 hessviz
# Raise the limits for a bigger box with -e, e.g. -e HESSVIZ_MEMORY_LIMIT=6GiB -e HESSVIZ_MAX_SECONDS=30,
# or run the workstation defaults with -e HESSVIZ_PROFILE=local.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    HESSVIZ_PROFILE=hosted \
    HESSVIZ_MEMORY_LIMIT=800MiB

WORKDIR /app
# requirements.txt pulls the CPU build of torch (its --extra-index-url), then the app's needs
COPY requirements.txt .
RUN pip install -r requirements.txt && useradd --create-home hessviz
COPY app.py ./
COPY .streamlit .streamlit
COPY hessviz hessviz
COPY pages pages
COPY assets/claims/claims.json assets/claims/claims.json
# the trained pydoc pair, the Real model page's precomputed default views (scripts/precompute_real.py) and
# the Whole model page's default tables (scripts/precompute_whole.py)
COPY assets/models assets/models
COPY assets/real_views.npz assets/real_views.npz
COPY assets/whole_tables.json assets/whole_tables.json

USER hessviz
EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4)"
CMD ["streamlit", "run", "app.py", "--server.address=0.0.0.0", "--server.port=8501"]
