"""``hessviz bench``: closed form against the strongest baselines, side by side in one run.

These suites ship with the package, so ``hessviz bench`` runs from any install; a baseline that needs
an optional package (``transformers``, ``curvlinops``: ``pip install "hessviz[bench,test]"``) is skipped
with one line naming it. Nothing in the library imports them (``tests/test_imports.py``):

* :mod:`hessviz.bench.dense`: dense Hessians and Jacobians against ``torch.func`` (``RESULTS.md``);
* :mod:`hessviz.bench.matfree`: matrix-free products at a MiniLM-sized layer (``MATFREE.md``);
* :mod:`hessviz.bench.matfree_spectra`: spectra at the speed of the products on a real MiniLM layer
  (a section of ``MATFREE.md``), against the eigensolvers of :mod:`hessviz.bench.peers`;
* :mod:`hessviz.bench.pretrained`: the pretrained-model loader (``PRETRAINED.md``).

The source checkout's ``benchmarks/`` folder holds the other benchmarks: scripts, each run as its
docstring says, and the ``benchmarks/*.md`` files that quote every figure measured, with its command.
"""
