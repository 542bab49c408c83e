"""Learned eviction: scorers trained to imitate the farthest-future oracle from causal
features of each resident expert's past, run behind the same interface as every rule.

groups    the groups of scorers: what each fits on, its kinds, where it is evaluated
labels    the oracle's choices, from replaying farthest-future on a recorded trace
fit       training with selection by validation loss (the features a scorer sees and the
          networks it trains are the rule's: policies/learned_features.py, scorers.py)
trace     the training trace: routing of sequences from the training part of the corpus
stage     the stage's jobs; the evaluation: share of the gap, in replay and closed loop
"""
