"""The source checkout's benchmark scripts (``python -m benchmarks.<name>`` from the checkout's root),
beside the ``*.md`` files that quote what they measured. The suites of ``hessviz bench`` ship with the
package (:mod:`hessviz.bench`); these need a checkout and its ``[test,bench]`` extras."""
