"""The command line's options: one per :class:`~hessviz.block.settings.Setting` of the block and the
input (:data:`~hessviz.block.config.BLOCK_SETTINGS`, :data:`~hessviz.block.config.INPUT_SETTINGS`), with
its type, range, help and flags from the table, and the options that read a checkpoint instead
(``--model``, ``--layer``, ``--text``/``--ids``, ``--objective``). A bad word is argparse's own error,
naming the field.
"""

from __future__ import annotations

import argparse

import torch

from hessviz.block.config import BLOCK_SETTINGS, INPUT_SETTINGS, Setting
from hessviz.errors import HessvizError
from hessviz.losses import names

DTYPES = {"float64": torch.float64, "float32": torch.float32}
OBJECTIVES = (names.SYNTHETIC, names.NEXT_TOKEN)
"""``--objective``: keys of :mod:`hessviz.losses.names` (its other spellings, ``next-token``, are read
too)."""


def add_setting(group: argparse._ArgumentGroup, s: Setting) -> None:
    """One command-line option from its :class:`~hessviz.block.config.Setting`."""
    help_ = f"{s.help} (default {s.format(s.default) if s.default is not None else 'none'})"
    if s.kind is bool and s.members:  # --bias, --bias Q,K,V, --no-bias
        group.add_argument(
            *s.flags,
            dest=s.name,
            nargs="?",
            const=True,
            type=word_parser(s),
            default=s.default,
            metavar=",".join(s.members),
            help=s.help,
        )
        group.add_argument(f"--no-{s.flag[2:]}", dest=s.name, action="store_const", const=False)
    elif s.kind is bool:
        group.add_argument(
            *s.flags, dest=s.name, action=argparse.BooleanOptionalAction, default=s.default, help=s.help
        )
    elif s.choices:
        group.add_argument(*s.flags, dest=s.name, choices=s.choices, default=s.default, help=help_)
    else:
        group.add_argument(
            *s.flags, dest=s.name, type=word_parser(s), default=s.default, metavar=s.name.upper(), help=help_
        )


def word_parser(s: Setting):
    """``text -> value`` of ``s`` for argparse: a bad word is argparse's error, naming the field."""

    def parse(text: str) -> object:
        try:
            return s.parse(text)
        except HessvizError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def add_block_args(p: argparse.ArgumentParser) -> None:
    block = p.add_argument_group("block")
    for s in BLOCK_SETTINGS:
        add_setting(block, s)
    given = p.add_argument_group("input")
    for s in INPUT_SETTINGS:
        add_setting(given, s)
    given.add_argument(
        "--wrt",
        nargs="+",
        default=None,
        metavar="NAME",
        help="parameters to differentiate (default: all), e.g. --wrt W_Q W_K or a head slice W_Q[0]",
    )
    given.add_argument("--dtype", choices=DTYPES, default="float64")
    given.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    model = p.add_argument_group(
        "real model (then the block and X come from the checkpoint; the block "
        "flags other than --loss are not read)"
    )
    model.add_argument(
        "--model",
        default=None,
        metavar="SOURCE",
        help="a local Hugging Face checkpoint folder or a bundled model (hessviz models)",
    )
    model.add_argument("--layer", type=int, default=0, help="the layer of the model (default 0)")
    model.add_argument("--text", default=None, help="the text whose hidden states enter the layer")
    model.add_argument(
        "--ids", type=int, nargs="+", default=None, metavar="ID", help="token ids instead of a text"
    )
    model.add_argument(
        "--objective",
        type=names.canonical,
        choices=OBJECTIVES,
        default=names.SYNTHETIC,
        help="synthetic: --loss against the seeded target; next_token: the model's own "
        "cross-entropy through its final norm and LM head (decoders, last layer)",
    )
