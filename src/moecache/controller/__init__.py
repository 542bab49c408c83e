"""The learned cache controller (the paper's "Learned" policy, its appendix "The learned
controller"): option-critic heads over the frozen model, after Shen and Henderson's
temporally extended routing. heads.py holds the heads, mixture.py the restricted MoE block
they train through, train.py the two objectives, evaluate.py the harness runs, and
compare.py the appendix table."""
