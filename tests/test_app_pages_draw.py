"""Pages only draw (issue 17): no page script computes what the library computes.

A page reads widgets, calls hessviz and draws. The checks read the source of every page
(``pages/*.py``) and of the Real model page's helpers (``hessviz/app/real_model.py``):
no linear algebra, no eigenvalue routine, no statistic (Gini, sums and means, logs), no
round-off rule of its own, no dense limit of its own and no family → loss map.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "pages").glob("*.py")) + [ROOT / "hessviz" / "app" / "real_model.py"]

FORBIDDEN = {
    "linear algebra": r"\blinalg\b",
    "an eigenvalue routine": r"\b(eig|eigh|eigvals|eigvalsh|eigsh)\b",
    "the Gini coefficient": r"\bgini \(",
    "a statistic over arrays": r"\bnp \. (sum|mean|median|std|var|diag|log|exp|polyfit|corrcoef) \(|"
    r"\. (mean|std|var) \(",
    "a round-off rule": r"\b1e-1[0-9]\b",
    "a dense limit of its own": r"^DENSE_LIMIT =",
}


def _expressions(fstring: str) -> list[str]:
    """The expressions inside an f-string literal, as source (``f"{np.sum(a):.2f}"`` -> ``np.sum(a)``)."""
    try:
        tree = ast.parse(fstring, mode="eval")
    except SyntaxError:
        return []
    return [ast.unparse(n.value) for n in ast.walk(tree) if isinstance(n, ast.FormattedValue)]


def code_lines(text: str) -> dict[int, str]:
    """Line number -> the code on it, token by token: string literals (the words a page shows)
    and comments left out, the expressions inside f-strings kept."""
    lines: dict[int, list[str]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            continue
        if tok.type == tokenize.STRING:
            if re.match(r"(?i)[rb]*f", tok.string):
                for expr in _expressions(tok.string):
                    lines.setdefault(tok.start[0], []).append(code_lines(expr + "\n").get(1, ""))
            continue
        lines.setdefault(tok.start[0], []).append(tok.string)
    return {i: " ".join(parts) for i, parts in lines.items()}


FAMILIES = {"bert", "roberta", "gpt2", "llama", "mistral", "qwen2", "qwen3", "gpt_neox", "opt"}
"""``config.json`` model types: a dict keyed by them in a page maps a family to something (its loss)."""


def family_maps(text: str) -> list[int]:
    """Lines of every dict literal keyed by a model family."""
    return [
        n.lineno
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.Dict)
        and any(isinstance(k, ast.Constant) and k.value in FAMILIES for k in n.keys)
    ]


def offences(text: str) -> list[tuple[str, int, str]]:
    """``(what, line number, code)`` of every forbidden computation in a page's source."""
    out = []
    for i, code in code_lines(text).items():
        for what, pattern in FORBIDDEN.items():
            if re.search(pattern, code):
                out.append((what, i, code))
    out += [("a family -> loss map", i, "") for i in family_maps(text)]
    return out


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_the_page_only_draws(path):
    assert offences(path.read_text()) == []


@pytest.mark.parametrize(
    "line,what",
    [
        ("eig = np.linalg.eigvalsh(0.5 * (B + B.T))", "linear algebra"),
        ("lam = torch.linalg.eigh(H)", "linear algebra"),
        ("g = gini(grads['norms'])", "the Gini coefficient"),
        ("flat = top <= 1e-10 * abs(top).max()", "a round-off rule"),
        ("share = float(np.sum(np.diag(norms) ** 2))", "a statistic over arrays"),
        ("DENSE_LIMIT = 2048", "a dense limit of its own"),
        ("title = f'Gini at init {tr[pl][\"gini\"].mean():.3f}'", "a statistic over arrays"),
        (
            'st.markdown(f"a factor of {positive.max() / positive.min():.3g} and {np.sum(a):.2f}")',
            "a statistic over arrays",
        ),
        ('OBJECTIVE = {"bert": "sentence similarity"}', "a family -> loss map"),
    ],
)
def test_the_check_sees_what_pages_once_computed(line, what):
    """Each line a page used to hold is caught; the same words in a comment or a caption are not."""
    assert what in [w for w, _, _ in offences(line)]
    assert offences(f"x = 1  # {line}\n") == []
    assert offences(f"st.caption({line!r})\n") == []
