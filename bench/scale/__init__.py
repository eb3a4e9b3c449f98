"""`make bench-scale`: the product at a million rows on a stock Postgres (issue 34 item 5).

See `bench/scale/__main__.py` for the run, `bench/scale/harness.py` for the result keys.
"""
