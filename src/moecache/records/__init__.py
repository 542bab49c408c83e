"""The records the stages exchange: what the harness and replay write and the report reads."""
