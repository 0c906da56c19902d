"""The next-token objective's old address: it lives in :mod:`hessviz.losses.next_token`."""

from hessviz.losses.next_token import CHUNK_SHARE, MAX_CHUNK, TOKEN_WISE_MAX_D, NextToken, default_chunk

__all__ = ["CHUNK_SHARE", "MAX_CHUNK", "TOKEN_WISE_MAX_D", "NextToken", "default_chunk"]
