"""`moecache plan --gpu-gib`: the largest pool that fits a GPU and what it decodes at (fit.py),
and with `--host-gib` its tier layout over host RAM and disk (tiers.py).

Above the harness and replay (tests/test_house.py): it reads their traces and replays them.
"""

# What `plan --gpu-gib G` keeps back from G, GiB, because accountant.account does not count it: the
# CUDA context (PyTorch's kernels and cuBLAS's workspace, several hundred MiB, outside
# torch.cuda.memory_allocated), the caching allocator's fragmentation and a token's
# activations. Nothing in the repository measures them (gpu-check reports the allocator's
# peak above the accountant's without the context, and not on a paper-sized run:
# docs/gpu-check.md), so this is a round figure, stated in every answer and overridden by
# --reserve-gib. Here, not in fit.py, so the command's help names it without importing torch.
RESERVE_GIB = 1.0
