"""One function per claim of the paper, a module per kind of claim (replay.py, learned.py,
controller.py, router.py, table2.py, dwell.py): each reads its results files through
`Results` and answers with this run's value, the setting, the verdict and the files
(`Found`), or raises `Missing`. The tolerances are the verdicts' own; paper_claims.CLAIMS
states them. Where the run's own evidence cannot decide a claim (a premise fails, or an
interval straddles the tolerance), the verdict is `undecided` and `why` says why, with the
size that would decide it (power.py computes those sizes)."""
