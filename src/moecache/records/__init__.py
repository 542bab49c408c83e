"""Typed records the stages exchange: the demand of a trace, batch geometry, run results.

The bottom of the house (tests/test_house.py): records import no stage, no harness, no replay
and no torch; harness and replay both read and build these.
"""
