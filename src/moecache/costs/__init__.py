"""What runs cost: equation (1) for copies that block the compute (equation.py), its form
with a term per tier (tier_equation.py) and the overlap cost model for copies beside it
(overlap.py), pure functions of the results files that the report, the controller's
commands and the model's fit all read."""
