"""Multiple-choice accuracy under restricted routing, through lm-eval."""
