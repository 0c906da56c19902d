"""The command line's parts beside :mod:`hessviz.cli` (the entry point, ``main``, and the commands):
:mod:`~hessviz.commands.options`, the options built from the settings table, and
:mod:`~hessviz.commands.guard`, what a command computes on and the checks before it starts.
"""
