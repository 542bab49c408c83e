"""The scientific verdicts the report states, decided on the stages' results files: the
learned scorers' (learned.py), Table 3's gap (router_tuning.py) and the controller's
comparisons (controller.py)."""
