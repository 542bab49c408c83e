"""Trace replay: lossless rules over recorded demand, bounds, the exact optimum, the sweep,
limited foresight, the libCacheSim reference and the benchmark. No torch here."""
