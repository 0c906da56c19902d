"""The settings table: one :class:`Setting` per user-facing value, declared once.

A :class:`hessviz.block.config.BlockConfig` field carries its :class:`Setting` in its metadata
(:func:`setting`); :func:`settings_of` reads them back in field order. A setting knows its type,
bounds, help text and command-line flags, checks a value (:meth:`Setting.check`), reads one from
a URL or command-line word (:meth:`Setting.parse`) and writes one back (:meth:`Setting.format`).
The command line is built from :data:`hessviz.block.config.SETTINGS`; the app adds how it shows
each one (URL key, label, range) in :mod:`hessviz.app.settings`. :data:`INPUT_SETTINGS` are the
input's two settings, which are not part of the block.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from hessviz.errors import ConfigError

TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class Setting:
    """One user-facing setting: what it is, where it may range, and how it is spelled.

    ``kind`` is ``int``, ``float``, ``str`` (one of ``choices``) or ``bool``; ``minimum`` is
    the library's lower bound (ints and floats), ``optional`` allows ``None``; ``short`` and
    ``alias`` are more command-line flags. ``members``: a ``bool`` setting that may also be a
    tuple of these words (``bias``), written ``Q,K,V`` on the command line (or in a URL).
    How the app shows a setting is :class:`hessviz.app.settings.AppSetting`.
    """

    help: str
    kind: type
    default: object
    minimum: float | None = None
    choices: tuple[str, ...] | None = None
    optional: bool = False
    short: str | None = None
    alias: str | None = None
    members: tuple[str, ...] | None = None
    name: str = ""

    @property
    def flag(self) -> str:
        """The long command-line flag, ``--d-model`` for ``d_model``."""
        return "--" + self.name.replace("_", "-")

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(f for f in (self.short, self.flag, self.alias) if f)

    def check(self, value: object) -> object:
        """``value`` if allowed, else :class:`ConfigError` naming the field and what is allowed."""
        if value is None and self.optional:
            return None
        if self.kind is bool and self.members and isinstance(value, tuple):
            unknown = [v for v in value if v not in self.members]
            if unknown or len(set(value)) != len(value):
                raise ConfigError(
                    f"{self.name} must be True, False or a tuple of distinct names from "
                    f"{self.members}, got {value!r}"
                )
        elif self.kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(
                    f"{self.name} must be True or False"
                    f"{' or a tuple of ' + ', '.join(self.members) if self.members else ''}"
                    f", got {value!r}"
                )
        elif self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
                raise ConfigError(
                    f"{self.name} must be an integer >= {self.minimum:g}"
                    f"{' or None' if self.optional else ''}, got {value!r}"
                )
        elif self.kind is float:
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < self.minimum
            ):
                raise ConfigError(f"{self.name} must be a finite number >= {self.minimum:g}, got {value!r}")
        elif value not in self.choices:
            raise ConfigError(
                f"{self.name} must be one of {', '.join(map(repr, self.choices))}, got {value!r}"
            )
        return value

    def parse(self, text: str) -> object:
        """The value written as ``text`` (a URL or command-line word), checked; ``ValueError``
        (a :class:`ConfigError`) naming the field when it is not allowed."""
        if not isinstance(text, str):
            raise ConfigError(f"{self.name} must be given as text, got {type(text).__name__}")
        word = text.strip()
        if self.optional and word.lower() in ("", "none"):
            return None
        if self.kind is bool and self.members and word.lower() not in TRUE_WORDS + FALSE_WORDS:
            return self.check(tuple(w.strip() for w in word.split(",") if w.strip()))
        try:
            value: object
            if self.kind is bool:
                if word.lower() not in TRUE_WORDS + FALSE_WORDS:
                    raise ValueError(word)
                value = word.lower() in TRUE_WORDS
            elif self.kind is int:
                value = int(word)
            elif self.kind is float:
                value = float(word)
            else:
                value = word
        except ValueError:
            kinds = {bool: "true or false", int: "an integer", float: "a number"}
            raise ConfigError(f"{self.name} must be {kinds[self.kind]}, got {text[:40]!r}") from None
        return self.check(value)

    def format(self, value: object) -> str:
        """How ``value`` is written in a URL: ``1.0 -> "1"``, ``True -> "true"``."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return ",".join(value)
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)


def setting(default: object, help: str, kind: type | None = None, **spec: object):
    """A :class:`BlockConfig` field whose :class:`Setting` lives in its metadata."""
    kind = kind or type(default)
    return field(default=default, metadata={"setting": Setting(help, kind, default, **spec)})


def optional(kind: type, minimum: float, help: str):
    """A :class:`BlockConfig` field that is None by default (the block's own rule, named in ``help``,
    applies) or a ``kind`` of at least ``minimum`` (for a float: above it)."""
    return setting(None, help, kind=kind, minimum=minimum, optional=True)


def settings_of(cls: type) -> tuple[Setting, ...]:
    """The :class:`Setting` of each field of the dataclass ``cls`` that has one, in field order,
    each named after its field."""
    return tuple(
        dataclasses.replace(f.metadata["setting"], name=f.name)
        for f in dataclasses.fields(cls)
        if "setting" in f.metadata
    )


INPUT_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "the spectral norm (largest singular value) of the input X",
        float,
        1.0,
        minimum=0.0,
        name="input_norm",
    ),
    Setting("draws the weights W ~ N(0, 1/fan_in), X and the target", int, 0, minimum=0, name="seed"),
)
"""The input's settings (not part of the block): its spectral norm and the seed."""
