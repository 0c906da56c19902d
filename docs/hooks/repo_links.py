"""MkDocs hook: the pages under ``docs/`` link to files of the repository outside ``docs/``
(``../benchmarks/RESULTS.md``, ``../assets/screenshots/spectrum.png``) so that they read right on
GitHub; the site has only ``docs/``. A link to a repository file that exists is rewritten for the
site: a picture is copied into the site (``_repo/<path>``) and shown, any other file becomes its
text, with ``repo_url``'s link when ``mkdocs.yml`` sets one. A link to a file that does not exist is
left alone, so that ``mkdocs build --strict`` still fails on it."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

LINK = re.compile(r"(!?)\[([^\]]*)\]\(\.\./([^)#\s]+)(#[^)\s]*)?\)")
PICTURES = (".png", ".jpg", ".jpeg", ".svg", ".gif")
COPIED = "_repo"


def repo_root(config) -> Path:
    return Path(config["docs_dir"]).resolve().parent


def rewrite(markdown: str, root: Path, repo_url: str | None = None) -> str:
    """``markdown`` with each ``](../path)`` link to an existing file of ``root`` rewritten."""

    def one(m: re.Match) -> str:
        bang, text, path, anchor = m.group(1), m.group(2), m.group(3), m.group(4) or ""
        target = (root / path).resolve()
        if not target.is_file() or root not in target.parents:
            return m.group(0)  # a broken link stays one: --strict reports it
        if path.lower().endswith(PICTURES):
            return f"{bang}[{text}]({COPIED}/{path})"
        if repo_url:
            return f"[{text}]({repo_url.rstrip('/')}/blob/HEAD/{path}{anchor})"
        return text if path in text else f"{text} (`{path}`)"

    return LINK.sub(one, markdown)


def on_files(files, config):
    """Copy the pictures the pages link to (``../x.png``) into the site as ``_repo/x.png``."""
    root, docs = repo_root(config), Path(config["docs_dir"])
    for page in docs.glob("*.md"):
        for m in LINK.finditer(page.read_text()):
            path = m.group(3)
            if (
                path.lower().endswith(PICTURES)
                and (root / path).is_file()
                and files.get_file_from_path(f"{COPIED}/{path}") is None
            ):
                files.append(File.generated(config, f"{COPIED}/{path}", abs_src_path=str(root / path)))
    return files


def on_page_markdown(markdown, page, config, files):
    if "/" in page.file.src_uri:  # links are written relative to docs/ itself
        return markdown
    return rewrite(markdown, repo_root(config), config.get("repo_url"))
