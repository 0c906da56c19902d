"""The benchmarks of hessviz: closed form against the strongest baselines, side by side in one run.

No part of the library: these modules import :mod:`hessviz`, and :mod:`hessviz` never imports them
(``tests/test_imports.py``), save ``hessviz bench``, which runs them from a source checkout:

* :mod:`benchmarks.dense`: dense Hessians and Jacobians against ``torch.func`` (``RESULTS.md``);
* :mod:`benchmarks.matfree`: matrix-free products at a MiniLM-sized layer (``MATFREE.md``);
* :mod:`benchmarks.matfree_spectra`: spectra at the speed of the products on a real MiniLM layer
  (a section of ``MATFREE.md``), against the eigensolvers of :mod:`benchmarks.peers`;
* :mod:`benchmarks.pretrained`: the pretrained-model loader (``PRETRAINED.md``).

The other ``benchmarks/*.py`` are scripts, each run as its docstring says (from the checkout's
root, ``PYTHONPATH=.`` where they import this package). Every figure they measured is quoted in the
``benchmarks/*.md`` beside them, with the command that measured it.
"""
