"""The test suite as a regular package, so `from tests.<module> import …` finds these
modules even where an installed distribution ships a top-level `tests` package of its
own (a regular package anywhere on `sys.path` wins over a namespace package)."""
