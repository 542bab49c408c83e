"""`moecache plan --gpu-gib`: the largest pool that fits a GPU and what it decodes at (fit.py),
and with `--host-gib` its tier layout over host RAM and disk (tiers.py).

Above the harness and replay (tests/test_house.py): it reads their traces and replays them.
"""
