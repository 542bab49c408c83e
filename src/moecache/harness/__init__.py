"""The offloading harness: expert pool, pooled MoE block, decoding, gates, profile, timing,
the trace format, and the stage jobs the command line runs."""
