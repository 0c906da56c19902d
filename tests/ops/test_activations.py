"""The activation table (:mod:`hessviz.ops.activations`): one row per ``activation`` setting."""

from hessviz.block import config
from hessviz.ops import activations
from hessviz.ops.elementwise import Elementwise


def test_table_rows_name_their_op():
    assert set(activations.ACTIVATIONS) == {"relu", "gelu", "gelu_tanh", "silu"}
    for name, op in activations.ACTIVATIONS.items():
        assert issubclass(op, Elementwise) and op.name == name and op.title
        assert activations.get(name) is op
    assert config.ACTIVATIONS == tuple(activations.ACTIVATIONS)  # the settings read this table
