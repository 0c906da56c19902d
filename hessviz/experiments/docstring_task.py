"""A real labelled text task that ships with Python: which standard-library module a docstring is from.

The protocol claims (``gini_protocol``, ``optimizers_protocol``) fine-tune the bundled models on it
with a linear classification head, as Tomihari & Sato fine-tune RoBERTa on GLUE.

**The data.** For each module of :data:`MODULES` (one class each, in that order), every public
function and class the module itself defines (``obj.__module__`` is the module) and every public
method or property of those classes, in name order; their docstrings by :func:`inspect.getdoc`,
whitespace collapsed to single spaces, duplicates dropped (first kept), and only those of at least
:data:`MIN_CHARS` characters. A docstring found under two modules is dropped from both (it would
carry two labels). Each class is then ordered by the SHA-256 of its text (stable across runs and
machines, unlike ``hash``), cut to :data:`PER_CLASS` texts, and its first :data:`TRAIN_PER_CLASS`
go to the train split, the rest to validation: a balanced, stratified, fixed split.

**Tokens.** :meth:`DocstringTask.ids` tokenises with each model's own ``tokenizer.json`` and cuts
every text to :data:`SEQ_LEN` tokens (every kept text is longer; a shorter one raises): the first
``SEQ_LEN`` ids for the pydoc models (no special tokens), and for a model whose tokenizer adds them
(MiniLM's ``[CLS] … [SEP]``) the first ``SEQ_LEN − 1`` ids then its closing token. Equal lengths
mean no padding, so no attention mask is needed.

Docstrings change between Python versions: :attr:`DocstringTask.python` and
:attr:`DocstringTask.counts` go into each claim's data.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import platform
import warnings
from dataclasses import dataclass
from functools import cache, lru_cache

import torch
from torch import Tensor

MODULES = ("decimal", "email.message", "inspect", "logging", "threading", "typing")
"""The classes, label ``i`` is ``MODULES[i]``."""
MIN_CHARS = 120
PER_CLASS = 32
TRAIN_PER_CLASS = 24
SEQ_LEN = 24
"""Tokens per sequence (the pydoc models have 64 positions)."""
SPLITS = ("train", "validation")


@dataclass(frozen=True)
class Example:
    text: str
    label: int


def module_docstrings(name: str) -> list[str]:
    """The public docstrings ``name`` defines (see the module docstring), in name order, deduplicated."""
    mod = importlib.import_module(name)
    found = []
    with warnings.catch_warnings():  # typing.io and typing.re warn when read (Python 3.11)
        warnings.simplefilter("ignore", DeprecationWarning)
        for attr, obj in sorted(vars(mod).items()):
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isclass(obj):
                for m_attr, member in sorted(vars(obj).items()):
                    if not m_attr.startswith("_") and (callable(member) or isinstance(member, property)):
                        found.append(inspect.getdoc(member))
            if callable(obj):
                found.append(inspect.getdoc(obj))
    texts = (" ".join(d.split()) for d in found if d)
    return [t for t in dict.fromkeys(texts) if len(t) >= MIN_CHARS]


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class DocstringTask:
    """The fixed split (see the module docstring)."""

    train: tuple[Example, ...]
    validation: tuple[Example, ...]
    available: tuple[int, ...]
    """Per class, the docstrings found before the cut to :data:`PER_CLASS`."""
    python: str

    @property
    def n_classes(self) -> int:
        return len(MODULES)

    @property
    def counts(self) -> dict[str, tuple[int, int]]:
        """``module -> (train, validation)`` examples."""
        return {
            m: (sum(e.label == i for e in self.train), sum(e.label == i for e in self.validation))
            for i, m in enumerate(MODULES)
        }

    def split(self, split: str) -> tuple[Example, ...]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        return self.train if split == "train" else self.validation

    def ids(self, source: str, split: str = "train", drop_short: bool = False) -> tuple[Tensor, Tensor]:
        """``(ids (N, SEQ_LEN), labels (N,))`` of ``split`` tokenised by ``source``'s tokenizer; a text
        shorter than ``SEQ_LEN`` tokens is an error, or left out with ``drop_short`` (a tokenizer with a
        large vocabulary, Gemma's 262,144 tokens, makes a few docstrings shorter)."""
        return _tokenised(self, source, split, drop_short)

    def batches(
        self, source: str, batch: int, seed: int, split: str = "train", drop_short: bool = False
    ) -> list[tuple[Tensor, Tensor]]:
        """``split`` shuffled by ``seed`` (a ``torch.Generator``) and cut into full batches of ``batch``
        (``drop_short``: :meth:`ids`)."""
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        ids, labels = self.ids(source, split, drop_short)
        order = torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(seed))
        n = ids.shape[0] // batch
        return [
            (ids[order[i * batch : (i + 1) * batch]], labels[order[i * batch : (i + 1) * batch]])
            for i in range(n)
        ]


@cache
def build() -> DocstringTask:
    """The task, built once per process."""
    per = [module_docstrings(m) for m in MODULES]
    seen: dict[str, int] = {}
    for texts in per:
        for t in texts:
            seen[t] = seen.get(t, 0) + 1
    train, validation, available = [], [], []
    for label, texts in enumerate(per):
        kept = sorted((t for t in texts if seen[t] == 1), key=_key)
        available.append(len(kept))
        if len(kept) < PER_CLASS:
            raise ValueError(
                f"module {MODULES[label]!r} has {len(kept)} docstrings of ≥ {MIN_CHARS} "
                f"characters on Python {platform.python_version()}, fewer than {PER_CLASS}"
            )
        kept = kept[:PER_CLASS]
        train += [Example(t, label) for t in kept[:TRAIN_PER_CLASS]]
        validation += [Example(t, label) for t in kept[TRAIN_PER_CLASS:]]
    return DocstringTask(tuple(train), tuple(validation), tuple(available), platform.python_version())


@lru_cache(maxsize=16)
def _tokenised(
    task: DocstringTask, source: str, split: str, drop_short: bool = False
) -> tuple[Tensor, Tensor]:
    from hessviz.pretrained import tokens
    from hessviz.pretrained.sources import open_source

    tok = tokens.tokenizer(open_source(source))
    specials = len(tok.encode("").ids) > 0  # [CLS] [SEP]: keep the closing token
    rows, labels = [], []
    for e in task.split(split):
        ids = tok.encode(e.text).ids
        if len(ids) < SEQ_LEN and drop_short:
            continue
        if len(ids) < SEQ_LEN:
            raise ValueError(
                f"text of label {MODULES[e.label]!r} is {len(ids)} tokens under {source!r}, "
                f"fewer than SEQ_LEN = {SEQ_LEN}: raise MIN_CHARS"
            )
        rows.append(ids[: SEQ_LEN - 1] + ids[-1:] if specials else ids[:SEQ_LEN])
        labels.append(e.label)
    return torch.tensor(rows, dtype=torch.int64), torch.tensor(labels, dtype=torch.int64)
