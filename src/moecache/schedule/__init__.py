"""What a run needs and decodes, from the validated settings alone: which runs each shard
decodes (runs.py) and the slots a decode job holds, whether a run fits the device (plan.py).

Below the harness and replay (tests/test_house.py): the harness's jobs and `moecache plan`
read the same functions, so the plan sizes what the jobs allocate.
"""
