"""Griffe extension for the API pages: hessviz's docstrings are written for ``help()`` and Sphinx
habits (``:func:`name``` roles, ``>>>`` doctests); mkdocstrings renders Markdown. This turns a role
into a code span and a run of doctest lines into a fenced ``pycon`` block, so that a doctest is not
read as a Markdown block quote. The docstrings themselves are left as they are."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc):`~?([^`]+)`")


def markdown(text: str) -> str:
    """``text`` with RST roles as code spans and each doctest (``>>>`` up to a blank line) fenced;
    what is already fenced is left as it is, so that a second pass changes nothing."""
    out, fence, fenced = [], None, False
    for line in ROLE.sub(r"`\1`", text).splitlines():
        stripped = line.lstrip()
        if fence is None and stripped.startswith("```"):
            fenced = not fenced
        elif fence is None and not fenced and stripped.startswith(">>>"):
            fence = line[: len(line) - len(stripped)]
            out += ["", f"{fence}```pycon"]
        elif fence is not None and not stripped:
            out.append(f"{fence}```")
            fence = None
        out.append(line)
    if fence is not None:
        out.append(f"{fence}```")
    return "\n".join(out)


class RstToMarkdown(griffe.Extension):
    """Rewrites each docstring once it is read: the package's own and every object's in it."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        self.on_object(obj=pkg)

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
