"""The learned cache controller (the paper's "Learned" policy, its appendix "The learned
controller"): option-critic heads over the frozen model, after Shen and Henderson's
temporally extended routing. The heads are part of the rule (policies/controller_heads.py);
mixture.py holds the restricted MoE block they train through, train.py the two objectives,
evaluate.py the harness runs, and compare.py the appendix table."""
