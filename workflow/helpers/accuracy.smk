# What accuracy.smk's rules read and the target `all` needs: one summary per task.
ACCURACY = config.get("accuracy") or {}


def accuracy_summaries():
    """One summary per task; none without the controller, whose heads its rows score."""
    if not (ACCURACY and CONTROLLER):
        return []
    return expand("results/accuracy/{task}/summary.json", task=ACCURACY["tasks"])
