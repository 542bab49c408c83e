"""Router fine-tuning for cache hits (the paper's section 3.3, second half, and appendix "A
router fine-tuned for cache hits"): GRPO with a simulated-LRU reward, a cache-size-tagged
variant, a variant rewarded by the harness's own copy count, an SFT control, merged and
measured in the harness. docs/router_tuning.md describes the stage.
"""
