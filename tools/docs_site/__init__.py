"""Generators of the documentation site's pages, read by the MkDocs hooks in ``tools/docs_hooks.py``.

Everything here is computed from the live code at build time (export tables, the ``accel`` parser,
the environment-variable and launch-option tables, benchmark results), never typed by hand.
"""
