"""mkdocs hook: the generated pages are rendered from the code as it is at build time, so the
site never shows a stale table or Note line (the committed copies, which tests/test_docs.py
checks, are for reading the docs without building them)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_pages  # noqa: E402


def on_page_markdown(markdown, page, config, files):
    make = gen_pages.PAGES.get(page.file.src_uri)
    return make() if make is not None else markdown
